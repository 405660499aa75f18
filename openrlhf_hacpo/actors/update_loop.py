"""One learner's training step on one rank: view, advantages, reference log-probs, mini-batch updates.

For learner k and a step's trajectories:

1. the learner's view (own rows and, for ``hacpo`` / ``naive``, foreign rows re-rendered in k's tokens);
2. advantages with ω^(k,j) in the baseline (eqs. 6–8) and the foreign-row coefficient ω^(j,k) (eq. 10, 1 on own
   rows), both read from the step's :class:`~openrlhf_hacpo.algorithms.CapabilityRatios`;
3. optional reference log-probs of the own rows this rank trains on (the KL term, :mod:`.update_plan`);
4. mini-batch updates m = 0, 1, ... (eq. 14, ``max_epochs`` passes): this rank's share of each global mini-batch in
   micro-batches with gradient accumulation, then one clipped DeepSpeed optimizer step.

The step in public steps (the protocol :class:`~.update_steps.UpdateSteps`, which the probe and :mod:`.first_update`
use): :meth:`UpdateLoop.prepare` (1–3), then :meth:`UpdateLoop.run_updates` (4), which runs
:meth:`UpdateLoop.run_update` per mini-batch: :meth:`~UpdateLoop.begin_update`, :meth:`~UpdateLoop.rows_to_train`,
:meth:`~UpdateLoop.backward`, :meth:`~UpdateLoop.finish_update`.

Foreign rows with zero gradient leave the backward pass (``skip_zero_grad_rows``): before each update the probe
(:mod:`.zero_grad_probe`, ``time/probe``) decides which foreign rows can contribute; the others' loss value and
metrics are counted from the probe. Micro-batches are grouped by length (``length_grouping``). Each micro-batch
carries what its loss reads (reference log-probs, row counts on the host), so it reads the device twice: the loss's
metrics, and the finiteness of its log-probs and loss with the entropy sum.

DeepSpeed's gradient accumulation is driven explicitly (``set_gradient_accumulation_boundary``): an update has as many
micro-batches as its rows need, the same number on every data-parallel rank (ranks with fewer run a zero-loss
micro-batch, so ZeRO-3's collective gathers stay in step), and the last one is the boundary. An update whose rows
all have zero gradient still takes its optimizer step (on zero gradients), as the full computation would.

Non-finite losses: a micro-batch whose loss (or log-probs) is NaN/inf contributes no gradient, and the optimizer
update of its mini-batch is skipped on every rank (parameters and Adam moments untouched); ``skipped_updates``
counts them.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors import first_update
from openrlhf_hacpo.actors.deepspeed_setup import SkippableOptimizer
from openrlhf_hacpo.actors.learner_metrics import record_view_stats
from openrlhf_hacpo.actors.micro_loss import account, loss_of, zero_surrogate
from openrlhf_hacpo.actors.rank_agreement import agree_on_count, any_rank
from openrlhf_hacpo.actors.results import RankTrainResult
from openrlhf_hacpo.actors.step_state import PreparedStep, StepRecords, UpdateState
from openrlhf_hacpo.actors.update_plan import my_share, plan_updates, reference_logprobs
from openrlhf_hacpo.actors.update_steps import MicroLoss
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.actors.zero_grad_probe import ZeroGradProbe, probe_enabled
from openrlhf_hacpo.algorithms import CapabilityRatios, LossTotals, compute_advantages, get_policy_loss
from openrlhf_hacpo.algorithms.losses import PolicyLossOutput, check_policy_input
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.models import response_logprobs
from openrlhf_hacpo.rollout import LearnerBatch, LearnerViewConfig, MicroBatch, Trajectory, build_learner_batch
from openrlhf_hacpo.utils.timing import PhaseTimer
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["UpdateLoop"]

logger = logging.getLogger(__name__)


class UpdateLoop:
    """The training step of one data-parallel rank of learner ``agent_index``.

    ``loss`` is the policy loss of ``cfg.algo.loss_name`` (:data:`~openrlhf_hacpo.algorithms.POLICY_LOSSES`);
    ``reference`` (a Ray actor handle or a plain :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker`) must be
    set when ``kl_coef > 0``. It implements :class:`~openrlhf_hacpo.actors.update_steps.UpdateSteps`.
    """

    def __init__(self, cfg: TrainConfig, agent: AgentConfig, agent_index: int, rank: int, world_size: int,
                 engine: Any, client_optimizer: SkippableOptimizer, tokenizer: Any, view_cfg: LearnerViewConfig,
                 device: torch.device) -> None:
        self.cfg, self.agent, self.agent_index = cfg, agent, agent_index
        self.rank, self.world_size = rank, world_size
        self.engine, self.client_optimizer = engine, client_optimizer
        self.tokenizer, self.view_cfg, self.device = tokenizer, view_cfg, device
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.loss = get_policy_loss(cfg.algo.loss_name)  # the table row: parameters and row rules
        self.loss_fn = self.loss  # what computes the loss (tests wrap it)
        self.probe = ZeroGradProbe(self)
        self.reference: Any = None
        self.updates_done = 0
        self.skipped_updates = 0
        self._last_grad_norm: float | None = None

    # ------------------------------------------------------------------------------------------------ the step
    def train_step(self, trajectories: Sequence[Trajectory], step: int, ratios: CapabilityRatios) -> RankTrainResult:
        """Update the policy on one step's trajectories (every agent's, verified).

        ``ratios`` are the capability ratios from the tracker (pre-update, shared by learners); ``step`` is 1-based.
        With ``old_logp_from_update`` both phases of :mod:`.first_update` run at once (other sources' trajectories
        must then be scored already: gspo and grpo read none) and the result carries the own rows' old log-prob
        sums.
        """
        if self.cfg.compute.old_logp_from_update:
            phase = first_update.own_rows_first(self, trajectories, step, ratios)
            result = first_update.finish_step(self, phase, first_update.old_means_of(trajectories, phase.old_logps))
            return replace(result, old_logp_sums=first_update.old_logp_sums(phase.old_logps))
        prepared = self.prepare(trajectories, step, ratios)
        record_view_stats(prepared.batch, prepared.advantages, prepared.stats,
                          [a.name for a in self.cfg.resolved_agents])
        return self.run_updates(prepared)

    def prepare(self, trajectories: Sequence[Trajectory], step: int, ratios: CapabilityRatios) -> PreparedStep:
        """Steps 1–3 of the module docstring: the learner's view, its advantages and coefficients
        (:meth:`attach_advantages`), the loss's input rules (:meth:`check_batch`), the update plan and the reference
        log-probs of this rank's own rows (KL term only), timed as ``view``, ``advantages`` and ``reference``."""
        timer = PhaseTimer()
        with timer.phase("view"):
            batch = self.learner_batch(trajectories)
        with timer.phase("advantages"):
            advantages = self.attach_advantages(batch, ratios)
            self.check_batch(batch)
        plan = plan_updates(batch, self.cfg, self.agent, step, self.world_size)
        with timer.phase("reference"):
            ref_logp = reference_logprobs(self.reference, plan, self.cfg, self.agent, self.rank, self.world_size) \
                if self.cfg.algo.loss.uses_kl else {}
        return PreparedStep(batch=batch, advantages=advantages, plan=plan, ref_logp=ref_logp, step=step, timer=timer,
                         stats=WeightedMeans(), records=StepRecords(skipped_before=self.skipped_updates))

    def run_updates(self, prepared: PreparedStep, first: int = 0) -> RankTrainResult:
        """Step 4: updates m = ``first``, ... of the plan (:meth:`run_update`), then the step's records (gradient
        norms, learning rate, median foreign ratio, work) and its result on this rank."""
        records, stats = prepared.records, prepared.stats
        for m in range(first, len(prepared.plan)):
            records.add(*self.run_update(prepared.plan[m], m, prepared.step, prepared.ref_logp, stats,
                                         records.foreign_ratios, prepared.timer, records.work))
        records.record(stats, self.world_size, self.device)
        return RankTrainResult(metrics=stats.state(), skipped_updates=self.skipped_updates - records.skipped_before,
                               skipped_updates_total=self.skipped_updates, updates=len(prepared.plan),
                               timings=dict(prepared.timer.seconds))

    def learner_batch(self, trajectories: Sequence[Trajectory]) -> LearnerBatch:
        """This agent's view of a step's trajectories (own rows only for gspo / grpo)."""
        k = self.agent_index
        rows = trajectories if self.cfg.trains_on_foreign else [t for t in trajectories if t.source == k]
        if not any(t.source == k for t in rows):
            raise ValueError(f"agent {self.agent.name!r}: the step holds none of its own trajectories")
        return build_learner_batch(rows, k, self.tokenizer, self.view_cfg, eos_token_id=self.tokenizer.eos_token_id)

    def attach_advantages(self, batch: LearnerBatch, ratios: CapabilityRatios) -> torch.Tensor:
        """Attach to ``batch`` the advantages (eqs. 6–8, baseline weights ω^(k,j)) and the coefficients ω^(j,k)
        (eq. 10; 1 on own rows, since R[k, k] = 1); returns the advantages."""
        k = self.agent_index
        sources = torch.tensor([r.source for r in batch.rows], dtype=torch.long)
        rewards = torch.tensor([r.reward for r in batch.rows], dtype=torch.float64)
        prompt_index = torch.tensor(batch.prompt_index(), dtype=torch.long)
        adv = compute_advantages(rewards, prompt_index, sources, k, ratios.baseline_weights(k),
                                 self.cfg.algo.advantage)
        batch.attach(adv.advantages, ratios.coefficients(k)[sources])
        return adv.advantages.float()

    def check_batch(self, batch: LearnerBatch) -> None:
        """Raise ``ValueError`` where ``batch`` breaks the loss's input rules (a row without response tokens, a
        non-finite or misshapen column, a foreign row for a loss of own rows only): checked once for the whole
        learner batch (the loss then runs unchecked), on the batch's columns: its token ids are not packed for this."""
        empty = [i for i, r in enumerate(batch.rows) if not r.response_ids]
        if empty:
            raise ValueError(f"agent {self.agent.name!r}: learner row {empty[0]} has no response tokens")
        if self.cfg.algo.loss.params.rollout_is and not batch.has_engine_logps:
            missing = [r for r in batch.rows if not math.isfinite(r.engine_logp_mean)]
            raise ValueError(f"agent {self.agent.name!r}: --rollout_is needs the sampling engines' log-probs of every "
                             f"row, {len(missing)} of {len(batch)} rows carry none (e.g. {missing[0].prompt_id!r} "
                             f"from agent {missing[0].source}): the rollout attaches them when "
                             "TrainConfig.keeps_engine_logps")
        whole = batch.whole_loss_input()
        if self.cfg.compute.old_logp_from_update:  # means not known yet are checked when they arrive (first_update)
            whole.old_logp_mean = torch.nan_to_num(whole.old_logp_mean, nan=0.0)
        check_policy_input(whole)
        self.loss.check_rows(whole.is_own)

    # ------------------------------------------------------------------------------------------------ one update
    def run_update(self, minibatch: LearnerBatch, m: int, step: int, ref_logp: dict[int, torch.Tensor],
                   stats: WeightedMeans, foreign_ratios: list[torch.Tensor], timer: PhaseTimer | None = None,
                   work: UpdateWork | None = None) -> tuple[float | None, float]:
        """One optimizer update m (eq. 14) on one global mini-batch: this rank's share (:meth:`begin_update`), the
        probe of its foreign rows (:meth:`rows_to_train`, ``probe``), the micro-batches' forward and backward and the
        optimizer step (:meth:`backward`, ``update``), then :meth:`finish_update`. Losses and metrics go to
        ``stats``, the sequence ratios of the foreign rows to ``foreign_ratios``, the work done to ``work``.

        Returns (gradient norm or None when skipped, learning rate of the update).
        """
        timer = timer if timer is not None else PhaseTimer()
        update = self.begin_update(minibatch, m, ref_logp, stats, foreign_ratios)
        rows = list(range(len(update.share)))
        if probe_enabled(self.cfg):
            with timer.phase("probe"):
                rows = self.rows_to_train(update, [i for i in rows if not update.share.rows[i].is_own])
        with timer.phase("update"):
            self.backward(update, update.share.select(rows), boundary=True)
        return self.finish_update(update, step, work)

    def begin_update(self, minibatch: LearnerBatch, m: int, ref_logp: dict[int, torch.Tensor],
                     stats: WeightedMeans, foreign_ratios: list[torch.Tensor]) -> UpdateState:
        """The state of update m on global mini-batch ``minibatch``: this rank's share, the loss's denominators (the
        global mini-batch's totals), its parameters at m (the stepwise lower bound, eq. 14), the learning rate the
        optimizer step will use, and where the update records (``stats``, ``foreign_ratios``)."""
        own_rows = [r for r in minibatch.rows if r.is_own]
        totals = LossTotals(num_seqs=len(minibatch), num_tokens=minibatch.num_response_tokens,
                            num_own_seqs=len(own_rows), num_own_tokens=sum(len(r.response_ids) for r in own_rows))
        share = my_share(minibatch, self.rank, self.world_size)
        return UpdateState(m=m, share=share, totals=totals, params=self.loss.params(self.cfg.algo.loss, m),
                       ref_logp=ref_logp, stats=stats, foreign_ratios=foreign_ratios,
                       lr=float(self.client_optimizer.param_groups[0]["lr"]),
                       work=UpdateWork(rows=len(share), tokens=share.num_response_tokens))

    def rows_to_train(self, update: UpdateState, foreign: list[int]) -> list[int]:
        """The probe (:class:`~.zero_grad_probe.ZeroGradProbe`) of the share's foreign rows ``foreign``: the indices
        into the share, sorted, of the rows that need a backward pass (own rows and foreign rows with non-zero
        gradient); the skipped rows' loss and metrics are recorded in ``update``."""
        probed = self.probe.run(update.share, foreign, update.m, update.totals, update.params, update.stats,
                                update.foreign_ratios, update.terms)
        update.work.add(probed.work)
        update.nonfinite |= not probed.finite
        return sorted([i for i, r in enumerate(update.share.rows) if r.is_own and i not in foreign] + probed.keep)

    def backward(self, update: UpdateState, rows: LearnerBatch, boundary: bool,
                 micro_loss: MicroLoss | None = None) -> None:
        """Forward, loss and backward of ``rows`` (of ``update``'s share) in micro-batches, accumulating gradients
        and recording each loss in ``update``; every rank runs as many micro-batches as the rank with most (a
        zero-loss pass on the others). With ``boundary`` the last one is the accumulation boundary and the
        optimizer step runs after it, skipped on every rank if any micro-batch was not finite. ``micro_loss``
        replaces the forward and loss of a micro-batch (:mod:`.first_update`)."""
        cfg, engine = self.cfg, self.engine
        micros = rows.micro_batches(cfg.train.micro_train_batch_size, group_by_length=cfg.compute.length_grouping) \
            if len(rows) else []
        count = agree_on_count(max(len(micros), int(boundary)), self.world_size, self.device)
        for i in range(count):
            last = boundary and i == count - 1
            engine.set_gradient_accumulation_boundary(last)
            if i < len(micros):
                self._train_micro(update, micros[i].packed(self.pad_token_id, self.device, update.ref_logp),
                                  micro_loss)
            else:  # nothing left for this rank: a zero loss keeps every rank's passes in step
                engine.backward(self._zero_loss(update.share), scale_wrt_gas=False)
            if last:
                update.nonfinite = any_rank(update.nonfinite, self.world_size, self.device)
                self.client_optimizer.skip_next_step = update.nonfinite
                if self.agent.zero_stage == 0 and not update.nonfinite:
                    self._last_grad_norm = _grad_norm(engine.module)
            engine.step()

    def _train_micro(self, update: UpdateState, micro: MicroBatch, micro_loss: MicroLoss | None = None) -> None:
        """Forward, loss and backward of one packed micro-batch, recorded in ``update``."""
        loss, out = micro_loss(micro) if micro_loss is not None else \
            self.micro_loss(micro, update.m, update.totals, update.ref_logp, update.params)
        update.work.count_backward(micro)
        if out is None:
            update.nonfinite = True
        else:
            account(out, micro, update.stats, update.foreign_ratios, update.terms)
        # DeepSpeed averages gradients over data-parallel ranks; the loss denominators are global totals
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def finish_update(self, update: UpdateState, step: int,
                      work: UpdateWork | None = None) -> tuple[float | None, float]:
        """Book an update whose optimizer step has run: its work added to ``work``, the skip counted (a non-finite
        update) or its loss terms recorded (sums over ranks); returns (gradient norm or None when skipped, learning
        rate)."""
        self.client_optimizer.skip_next_step = False
        if work is not None:
            work.add(update.work)
        if update.nonfinite:
            self.skipped_updates += 1
            logger.warning("agent %r step %d update %d: non-finite loss, update skipped (%d skipped so far)",
                           self.agent.name, step, update.m, self.skipped_updates)
            return None, update.lr
        self.updates_done += 1
        # each rank holds a share of the mini-batch sums; the merged mean over ranks times world_size is their sum
        for name, key in (("loss", "loss"), ("pg_loss", "policy/pg_loss"), ("kl", "policy/kl")):
            update.stats.add(key, update.terms[name] * self.world_size, 1.0)
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._last_grad_norm
        return (float(grad_norm) if grad_norm is not None else None), update.lr

    # ------------------------------------------------------------------------------------------------ the loss
    def forward(self, micro: MicroBatch, with_entropy: bool = False) -> Any:
        """Response log-probs (and entropies) of a packed micro-batch under the current policy."""
        return response_logprobs(self.engine, micro.packed, self.cfg.rollout.temperature, with_entropy=with_entropy,
                                 path=self.cfg.compute.logprob_path, backend=self.cfg.compute.kernel_backend)

    def micro_loss(self, micro: MicroBatch, m: int, totals: LossTotals, ref_logp: dict[int, torch.Tensor],
                   params: Any = None) -> tuple[torch.Tensor, PolicyLossOutput | None]:
        """Forward and policy loss of one packed micro-batch of update ``m``: ``(loss, PolicyLossOutput)``, or
        ``(zero-gradient surrogate, None)`` when the log-probs or the loss are not finite (see :func:`.loss_of`)."""
        scored = self.forward(micro, with_entropy=True)
        out = self.loss_of(micro, scored.logp, scored.entropy, m, totals, ref_logp, params)
        return (out.loss, out) if out is not None else (zero_surrogate(scored.logp), None)

    def loss_of(self, micro: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor | None, m: int,
                totals: LossTotals, ref_logp: dict[int, torch.Tensor], params: Any) -> PolicyLossOutput | None:
        """The policy loss of ``micro`` at log-probs ``logp`` at update m (eqs. 10–14 with the KL term), or None
        when the loss or the log-probs are not finite: :func:`.micro_loss.loss_of` with this learner's loss. Every
        loss call of the update and of the probe goes through here."""
        return loss_of(self.loss_fn, self.cfg, micro, logp, entropy, m, totals, ref_logp, params)

    def _zero_loss(self, share: LearnerBatch) -> torch.Tensor:
        """A zero loss through a forward of one row: zero gradient, the same passes as a real micro-batch."""
        return zero_surrogate(self.forward(share.select([0]).packed(self.pad_token_id, device=self.device)).logp)


def _grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the accumulated gradients (before clipping), for engines that do not report one."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
