"""One learner's training step on one rank: view, advantages, reference log-probs, mini-batch updates.

For learner k and a step's trajectories:

1. the learner's view (own rows and, for ``hacpo`` / ``naive``, foreign rows re-rendered in k's tokens);
2. advantages with ω^(k,j) in the baseline (eqs. 6–8) and the foreign-row coefficient ω^(j,k) (eq. 10, 1 on own
   rows), both read from the step's :class:`~openrlhf_hacpo.algorithms.CapabilityRatios`;
3. optional reference log-probs of the own rows this rank trains on (the KL term);
4. mini-batch updates m = 0, 1, ... (eq. 14, ``max_epochs`` passes): this rank's share of each global mini-batch in
   micro-batches with gradient accumulation, then one clipped DeepSpeed optimizer step.

Rows with zero gradient leave the backward pass (``skip_zero_grad_rows``). A foreign row's objective passes no
gradient while its sequence ratio s lies outside the foreign rule's window at update m (``clamp`` passes zero
gradient there whatever the sign of A). Before each update a forward pass without gradient scores this rank's
foreign rows (the *probe*); the kernel's own gradient with respect to those log-probs says which rows can contribute
(so the decision follows whichever rule is active: ``pessimistic``, no clip, Naive's own-row clip). A row whose
log-ratio moved by ``SKIP_MARGIN`` either way would still have zero gradient is skipped: it goes through no forward
with gradient and no backward. Its loss value and metrics still count, computed from the probe's log-probs. Skipped
rows change no gradient: each row's log-probs depend only on that row, and the loss's denominators are the global
mini-batch totals. Micro-batches are built from the remaining rows, grouped by length (``length_grouping``), so the
tokens computed are close to the tokens that count.

DeepSpeed's gradient accumulation is driven explicitly (``set_gradient_accumulation_boundary``): an update has as many
micro-batches as its rows need, the same number on every data-parallel rank (ranks with fewer run a zero-loss
micro-batch, so ZeRO-3's collective gathers stay in step), and the last one is the boundary. An update whose rows
all have zero gradient still takes its optimizer step (on zero gradients), as the full computation would.

Non-finite losses: a micro-batch whose loss (or log-probs) is NaN/inf contributes no gradient, and the optimizer
update of its mini-batch is skipped on every rank (parameters and Adam moments untouched); ``skipped_updates``
counts them.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableOptimizer
from openrlhf_hacpo.actors.learner_metrics import record_loss_metrics, record_view_stats
from openrlhf_hacpo.actors.results import RankTrainResult
from openrlhf_hacpo.algorithms import CapabilityRatios, LossTotals, compute_advantages, get_policy_loss
from openrlhf_hacpo.algorithms.losses import PolicyLossOutput, check_policy_input
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.models import response_logprobs
from openrlhf_hacpo.rollout import LearnerBatch, LearnerViewConfig, MicroBatch, Trajectory, build_learner_batch
from openrlhf_hacpo.utils.padding import micro_batch_groups, pad_values
from openrlhf_hacpo.utils.partition import split_evenly
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.utils.timing import PhaseTimer
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["UpdateLoop", "PROBE_ROWS_FACTOR", "SKIP_MARGIN"]

logger = logging.getLogger(__name__)

PROBE_ROWS_FACTOR = 4
"""The probe packs this many times ``micro_train_batch_size`` rows per forward: without gradient it keeps no
activations, so larger passes cost less per row than the update's."""

SKIP_MARGIN = 1e-3
"""A foreign row is skipped only if its gradient would stay zero with its mean log-ratio moved by this much either
way (about 0.1% in s), so the float noise between the probe's forward and the update's cannot hide a contributing
row."""


@dataclass
class _Work:
    """What one update computed, summed over its micro-batches (this rank)."""

    rows: int = 0
    tokens: int = 0
    rows_backward: int = 0
    tokens_backward: int = 0
    positions_update: int = 0  # packed positions B·(P+R) of the micro-batches with gradient
    real_update: int = 0
    positions_probe: int = 0
    real_probe: int = 0
    rows_backward_index: list[int] = dataclasses.field(default_factory=list)  # row_index of those rows_backward

    def add(self, other: "_Work") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class UpdateLoop:
    """The training step of one data-parallel rank of learner ``agent_index``.

    ``loss`` is the policy loss of ``cfg.algo.loss_name`` (:data:`~openrlhf_hacpo.algorithms.POLICY_LOSSES`); ``reference`` (a Ray actor handle or a plain
    :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker`) must be set when ``kl_coef > 0``.
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
        self.reference: Any = None
        self.updates_done = 0
        self.skipped_updates = 0
        self._last_grad_norm: float | None = None

    # ------------------------------------------------------------------------------------------------ the step
    def train_step(self, trajectories: Sequence[Trajectory], step: int, ratios: CapabilityRatios) -> RankTrainResult:
        """Update the policy on one step's trajectories (every agent's, verified).

        ``ratios`` are the capability ratios from the tracker (pre-update, shared by learners); ``step`` is 1-based.
        """
        timer = PhaseTimer()
        with timer.phase("view"):
            batch = self.learner_batch(trajectories)
        with timer.phase("advantages"):
            advantages = self._attach_advantages(batch, ratios)
            self._check_batch(batch)
        stats = WeightedMeans()
        record_view_stats(batch, advantages, stats, [a.name for a in self.cfg.resolved_agents()])
        plan = self._plan_updates(batch, step)

        with timer.phase("reference"):
            ref_logp = self._reference_logprobs(plan) if self.cfg.algo.loss.uses_kl else {}

        skipped_before = self.skipped_updates
        grad_norms, lrs, foreign_ratios, work = [], [], [], _Work()
        for m, minibatch in enumerate(plan):
            grad_norm, lr = self._update(minibatch, m, step, ref_logp, stats, foreign_ratios, timer, work)
            if grad_norm is not None:
                grad_norms.append(grad_norm)
            lrs.append(lr)
        for g in grad_norms:
            stats.add("grad_norm", g, 1.0)
        foreign_s = torch.cat(foreign_ratios) if foreign_ratios else torch.empty(0)
        if foreign_s.numel():
            # median of s over the foreign rows this rank trained on (ranks' medians are averaged when merged)
            stats.add("policy/foreign_ratio_median", float(foreign_s.median()), float(foreign_s.numel()))
        stats.add("lr", lrs[-1] if lrs else 0.0, 1.0)
        self._record_work(work, stats)
        if self.device.type == "cuda":  # this rank's peak so far (ranks' peaks are averaged when merged)
            stats.add("perf/cuda_max_allocated_gib", torch.cuda.max_memory_allocated(self.device) / 2**30, 1.0)
        return RankTrainResult(metrics=stats.state(), skipped_updates=self.skipped_updates - skipped_before,
                               skipped_updates_total=self.skipped_updates, updates=len(plan),
                               timings=dict(timer.seconds))

    def learner_batch(self, trajectories: Sequence[Trajectory]) -> LearnerBatch:
        """This agent's view of a step's trajectories (own rows only for gspo / grpo)."""
        k = self.agent_index
        rows = trajectories if self.cfg.trains_on_foreign else [t for t in trajectories if t.source == k]
        if not any(t.source == k for t in rows):
            raise ValueError(f"agent {self.agent.name!r}: the step holds none of its own trajectories")
        return build_learner_batch(rows, k, self.tokenizer, self.view_cfg, eos_token_id=self.tokenizer.eos_token_id)

    def _attach_advantages(self, batch: LearnerBatch, ratios: CapabilityRatios) -> torch.Tensor:
        """Attach the advantages (eqs. 6–8, baseline weights ω^(k,j)) and the coefficients ω^(j,k) (eq. 10; 1 on
        own rows, since R[k, k] = 1); returns the advantages."""
        k = self.agent_index
        sources = torch.tensor([r.source for r in batch.rows], dtype=torch.long)
        rewards = torch.tensor([r.reward for r in batch.rows], dtype=torch.float64)
        prompt_index = torch.tensor(batch.prompt_index(), dtype=torch.long)
        adv = compute_advantages(rewards, prompt_index, sources, k, ratios.baseline_weights(k),
                                 self.cfg.algo.advantage)
        batch.attach(adv.advantages, ratios.coefficients(k)[sources])
        return adv.advantages.float()

    def _check_batch(self, batch: LearnerBatch) -> None:
        """The loss's input rules, checked once for the whole learner batch (the loss then runs unchecked), on the
        batch's columns: its token ids are not packed for this."""
        empty = [i for i, r in enumerate(batch.rows) if not r.response_ids]
        if empty:
            raise ValueError(f"agent {self.agent.name!r}: learner row {empty[0]} has no response tokens")
        whole = batch.whole_loss_input()
        check_policy_input(whole)
        self.loss.check_rows(whole.is_own)

    def _plan_updates(self, batch: LearnerBatch, step: int) -> list[LearnerBatch]:
        """The step's global mini-batches in update order m = 0, 1, ... (``max_epochs`` passes)."""
        cfg = self.cfg
        num_minibatches = len(batch) // cfg.train_batch_size
        plan = []
        for epoch in range(cfg.max_epochs):
            seed = derive_seed(cfg.seed, "minibatch", step, self.agent.name, epoch)
            plan.extend(batch.split_minibatches(num_minibatches, order=cfg.minibatch_order, seed=seed,
                                                dp_chunks=self.world_size))
        return plan

    def _my_share(self, minibatch: LearnerBatch) -> LearnerBatch:
        """This rank's contiguous share of a global mini-batch (v1's data-parallel dispatch)."""
        return minibatch.select(split_evenly(len(minibatch), self.world_size)[self.rank])

    def _reference_logprobs(self, plan: list[LearnerBatch]) -> dict[int, torch.Tensor]:
        """Reference log-probs of this rank's own rows (the KL term covers own rows only), by row index."""
        if self.reference is None:
            raise RuntimeError(f"agent {self.agent.name!r}: kl_coef > 0 but no reference worker is attached")
        # a reference on the policy's own ZeRO-3 model (a LoRA agent's) gathers collectively: every rank scores its
        # whole share, so all ranks run the same number of forward passes
        every_row = (self.world_size > 1 and self.agent.zero_stage == 3
                     and getattr(self.reference, "runs_on_policy_model", False))
        wanted: dict[int, Any] = {}
        for minibatch in plan:
            share = self._my_share(minibatch)
            for row, index in zip(share.rows, share.row_index.tolist()):
                if row.is_own or every_row:
                    wanted[index] = row
        indices = sorted(wanted)
        args = ([wanted[i].prompt_ids for i in indices], [wanted[i].response_ids for i in indices],
                self.cfg.temperature, self.cfg.length_grouping)
        if hasattr(self.reference.compute_logprobs, "remote"):
            import ray

            values = ray.get(self.reference.compute_logprobs.remote(*args))
        else:
            values = self.reference.compute_logprobs(*args)
        return dict(zip(indices, values))

    # ------------------------------------------------------------------------------------------------ one update
    def _update(self, minibatch: LearnerBatch, m: int, step: int, ref_logp: dict[int, torch.Tensor],
                stats: WeightedMeans, foreign_ratios: list[torch.Tensor], timer: PhaseTimer | None = None,
                work: _Work | None = None) -> tuple[float | None, float]:
        """One optimizer update on one global mini-batch (this rank's share, in micro-batches); the sequence ratios
        of its foreign rows are appended to ``foreign_ratios``.

        Returns (gradient norm or None when skipped, learning rate of the update).
        """
        cfg, engine = self.cfg, self.engine
        timer = timer if timer is not None else PhaseTimer()
        own_rows = [r for r in minibatch.rows if r.is_own]
        totals = LossTotals(num_seqs=len(minibatch), num_tokens=minibatch.num_response_tokens,
                            num_own_seqs=len(own_rows), num_own_tokens=sum(len(r.response_ids) for r in own_rows))
        params = self.loss.params(cfg.algo.loss, m)
        share = self._my_share(minibatch)
        done = _Work(rows=len(share), tokens=share.num_response_tokens)
        lr = float(self.client_optimizer.param_groups[0]["lr"])  # the rate this update uses
        terms = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0}
        nonfinite = False

        grad_rows = share
        if self._may_skip():
            with timer.phase("probe"):
                keep, probe_work, probe_ok = self._probe_and_account(share, m, totals, params, ref_logp, stats,
                                                                      foreign_ratios, terms)
            grad_rows = share.select(keep)
            done.add(probe_work)
            nonfinite |= not probe_ok

        with timer.phase("update"):
            micros = grad_rows.micro_batches(cfg.micro_train_batch_size, group_by_length=cfg.length_grouping) \
                if len(grad_rows) else []
            count = self._agree_on_count(max(len(micros), 1))
            for i in range(count):
                engine.set_gradient_accumulation_boundary(i == count - 1)
                if i < len(micros):
                    micro = micros[i].packed(self.pad_token_id, device=self.device)
                    loss, out = self.micro_loss(micro, m, totals, ref_logp, params)
                    done.rows_backward += len(micro)
                    done.rows_backward_index += micros[i].row_index.tolist()
                    done.tokens_backward += int(micro.response_mask.sum())
                    done.positions_update += int(micro.packed.attention_mask.numel())
                    done.real_update += int(micro.packed.attention_mask.sum())
                    if out is None:
                        nonfinite = True
                    else:
                        self._account(out, micro, stats, foreign_ratios, terms)
                else:  # nothing left for this rank: a zero loss keeps every rank's passes in step
                    loss = self._zero_loss(share)
                # DeepSpeed averages gradients over data-parallel ranks; the loss denominators are global totals
                engine.backward(loss * self.world_size, scale_wrt_gas=False)
                if i == count - 1:
                    nonfinite = self._any_rank(nonfinite)
                    self.client_optimizer.skip_next_step = nonfinite
                    if self.agent.zero_stage == 0 and not nonfinite:
                        self._last_grad_norm = _grad_norm(engine.module)
                engine.step()
        self.client_optimizer.skip_next_step = False
        if work is not None:
            work.add(done)
        if nonfinite:
            self.skipped_updates += 1
            logger.warning("agent %r step %d update %d: non-finite loss, update skipped (%d skipped so far)",
                           self.agent.name, step, m, self.skipped_updates)
            return None, lr
        self.updates_done += 1
        # each rank holds a share of the mini-batch sums; the merged mean over ranks times world_size is their sum
        stats.add("loss", terms["loss"] * self.world_size, 1.0)
        stats.add("policy/pg_loss", terms["pg_loss"] * self.world_size, 1.0)
        stats.add("policy/kl", terms["kl"] * self.world_size, 1.0)
        grad_norm = engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._last_grad_norm
        return (float(grad_norm) if grad_norm is not None else None), lr

    def micro_loss(self, micro: MicroBatch, m: int, totals: LossTotals, ref_logp: dict[int, torch.Tensor],
                   params: Any = None) -> tuple[torch.Tensor, PolicyLossOutput | None]:
        """Policy loss of one packed micro-batch of update ``m``: ``(loss, PolicyLossOutput)``, or ``(zero-gradient
        surrogate, None)`` when the log-probs or the loss are not finite.

        ``totals`` are the global mini-batch's counts, the loss's denominators; ``ref_logp`` maps own rows'
        ``row_index`` to their reference log-probs (empty without a KL term). The output's metrics carry the
        micro-batch's mean token entropy as ``entropy`` (weighted by its tokens).
        """
        cfg = self.cfg
        scored = response_logprobs(self.engine, micro.packed, cfg.temperature, with_entropy=True,
                                   path=cfg.logprob_path, backend=cfg.kernel_backend)
        out = self._loss_of(micro, scored.logp, scored.entropy, m, totals, ref_logp, params)
        if out is not None:
            return out.loss, out
        # a zero loss built from the forward outputs: every rank runs backward through the same graph (ZeRO-3's
        # gather/reduce hooks stay in step) and no gradient reaches the parameters
        return (torch.nan_to_num(scored.logp, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum(), None

    def _loss_of(self, micro: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor | None, m: int,
                 totals: LossTotals, ref_logp: dict[int, torch.Tensor], params: Any) -> PolicyLossOutput | None:
        """The loss of ``micro`` at log-probs ``logp`` (with or without gradient), or None when not finite."""
        cfg = self.cfg
        mask = micro.response_mask
        if not bool(torch.isfinite(logp.detach()[mask > 0]).all()):
            return None
        ref = None
        if cfg.algo.loss.uses_kl:  # own rows only; foreign rows and padding hold 0
            rows = [ref_logp[index] if own else None
                    for own, index in zip(micro.is_own.tolist(), micro.row_index.tolist())]
            ref = pad_values(rows, mask.shape[1]).to(self.device)
        inp = micro.loss_input(logp, m, totals, ref_logp=ref, token_level=cfg.algo.token_level_ratios)
        out = self.loss_fn(inp, cfg.algo.loss, backend=cfg.kernel_backend, params=params, check=False)
        if not bool(torch.isfinite(out.loss.detach())):
            return None
        if entropy is not None:
            # mean entropy of the next-token distribution over these response tokens, weighted by their count
            tokens = float(mask.sum())
            out.metrics["entropy"] = float((entropy * mask).sum() / max(tokens, 1.0))
            out.weights["entropy"] = tokens
        return out

    def _account(self, out: PolicyLossOutput, micro: MicroBatch, stats: WeightedMeans,
                 foreign_ratios: list[torch.Tensor], terms: dict[str, float]) -> None:
        """Add one loss call's value, terms and metrics to the update's records."""
        for name in terms:
            terms[name] += out.metrics[name]
        record_loss_metrics(out, stats)
        if out.ratios is not None:
            foreign_ratios.append(out.ratios.detach().float().cpu()[~micro.is_own.cpu()])

    # ------------------------------------------------------------------------------------------------ skipping
    def _may_skip(self) -> bool:
        """Whether foreign rows are tested for zero gradient (sequence ratios only). Decided by the config alone, so
        every rank of the agent probes (ZeRO-3's gathers are collective)."""
        cfg = self.cfg
        return cfg.skip_zero_grad_rows and cfg.trains_on_foreign and not cfg.algo.token_level_ratios

    @torch.no_grad()
    def _probe_and_account(self, share: LearnerBatch, m: int, totals: LossTotals, params: Any,
                           ref_logp: dict[int, torch.Tensor], stats: WeightedMeans,
                           foreign_ratios: list[torch.Tensor], terms: dict[str, float]
                           ) -> tuple[list[int], _Work, bool]:
        """Score this rank's foreign rows without gradient and keep those that can contribute gradient.

        Returns (indices into ``share`` of the rows that need a backward pass: every own row and the contributing
        foreign rows, in ``share`` order; the probe's work; whether every probed value was finite). The skipped
        rows' loss value, terms and metrics are added to the records here.
        """
        cfg = self.cfg
        foreign = [i for i, r in enumerate(share.rows) if not r.is_own]
        groups = micro_batch_groups([len(share.rows[i].prompt_ids) for i in foreign],
                                    [len(share.rows[i].response_ids) for i in foreign],
                                    cfg.micro_train_batch_size * PROBE_ROWS_FACTOR, cfg.length_grouping)
        count = self._agree_on_count(len(groups))
        work, keep, finite = _Work(), {i for i, r in enumerate(share.rows) if r.is_own}, True
        for g in range(count):
            if g >= len(groups):  # keep ZeRO-3's gathers in step with ranks that have more to probe
                response_logprobs(self.engine, share.select([0]).packed(self.pad_token_id, self.device).packed,
                                  cfg.temperature, path=cfg.logprob_path, backend=cfg.kernel_backend)
                continue
            members = [foreign[j] for j in groups[g]]  # indices into share
            micro = share.select(members).packed(self.pad_token_id, device=self.device)
            work.positions_probe += int(micro.packed.attention_mask.numel())
            work.real_probe += int(micro.packed.attention_mask.sum())
            scored = response_logprobs(self.engine, micro.packed, cfg.temperature, with_entropy=True,
                                       path=cfg.logprob_path, backend=cfg.kernel_backend)
            has_grad = self._rows_with_gradient(micro, scored.logp, m, totals, params)
            if has_grad is None:  # non-finite log-probs: train every row, the update then skips as usual
                keep.update(members)
                finite = False
                continue
            flags = has_grad.tolist()
            keep.update(i for i, flag in zip(members, flags) if flag)
            skipped = [j for j, flag in enumerate(flags) if not flag]
            if skipped:
                sub = _select_micro(micro, skipped)
                out = self._loss_of(sub, scored.logp[skipped], scored.entropy[skipped], m, totals, ref_logp, params)
                if out is None:
                    keep.update(members[j] for j in skipped)
                    finite = False
                else:
                    self._account(out, sub, stats, foreign_ratios, terms)
        return sorted(keep), work, finite

    def _rows_with_gradient(self, micro: MicroBatch, logp: torch.Tensor, m: int, totals: LossTotals,
                            params: Any) -> torch.Tensor | None:
        """[B] bool: rows whose loss gradient is non-zero at ``logp`` or at ``logp`` shifted by ±``SKIP_MARGIN``
        (the same kernel and parameters as the update); None when ``logp`` is not finite."""
        mask = micro.response_mask
        if not bool(torch.isfinite(logp[mask > 0]).all()):
            return None
        has_grad = torch.zeros(len(micro), dtype=torch.bool, device=logp.device)
        foreign_params = _without_kl(params)
        for shift in (0.0, SKIP_MARGIN, -SKIP_MARGIN):
            with torch.enable_grad():
                probe = (logp.detach() + shift).requires_grad_(True)
                inp = micro.loss_input(probe, m, totals, token_level=False)
                out = self.loss_fn(inp, self.cfg.algo.loss, backend=self.cfg.kernel_backend,
                                   params=foreign_params, check=False)
                (grad,) = torch.autograd.grad(out.loss, probe)
            has_grad |= (grad * mask != 0).any(dim=1)
        return has_grad

    def _zero_loss(self, share: LearnerBatch) -> torch.Tensor:
        """A zero loss through a forward of one row: zero gradient, the same passes as a real micro-batch."""
        micro = share.select([0]).packed(self.pad_token_id, device=self.device)
        scored = response_logprobs(self.engine, micro.packed, self.cfg.temperature, path=self.cfg.logprob_path,
                                   backend=self.cfg.kernel_backend)
        return (torch.nan_to_num(scored.logp, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum()

    def _record_work(self, work: _Work, stats: WeightedMeans) -> None:
        """Rows and tokens trained and those that reached a backward pass (sums over ranks, per step), and the
        padding share of the update's and the probe's packed positions."""
        w = float(self.world_size)
        stats.add("perf/rows_trained", work.rows * w, 1.0)
        stats.add("perf/tokens_trained", work.tokens * w, 1.0)
        stats.add("perf/rows_backward", work.rows_backward * w, 1.0)
        stats.add("perf/tokens_backward", work.tokens_backward * w, 1.0)
        if work.positions_update:
            stats.add("perf/pad_frac_update", 1.0 - work.real_update / work.positions_update,
                      float(work.positions_update))
        if work.positions_probe:
            stats.add("perf/pad_frac_probe", 1.0 - work.real_probe / work.positions_probe,
                      float(work.positions_probe))

    # ------------------------------------------------------------------------------------------------ ranks
    def _agree_on_count(self, count: int) -> int:
        """The largest ``count`` over this agent's ranks (every rank runs that many passes)."""
        if self.world_size == 1:
            return count
        value = torch.tensor([float(count)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return int(value.item())

    def _any_rank(self, flag: bool) -> bool:
        """True on every rank of this agent when ``flag`` is True on any (all ranks skip an update together)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item() > 0)


def _select_micro(micro: MicroBatch, rows: list[int]) -> MicroBatch:
    """The micro-batch restricted to ``rows`` (loss columns and model inputs sliced alike)."""
    index = torch.tensor(rows, dtype=torch.long, device=micro.is_own.device)
    packed = type(micro.packed)(**{f.name: getattr(micro.packed, f.name)[index]
                                   for f in dataclasses.fields(micro.packed)})
    return MicroBatch(packed=packed, advantages=micro.advantages[index], coef=micro.coef[index],
                      old_logp_mean=micro.old_logp_mean[index], old_logp=micro.old_logp[index],
                      is_own=micro.is_own[index], row_index=micro.row_index[index])


def _without_kl(params: Any) -> Any:
    """The loss parameters without the KL term (the probe scores foreign rows, which carry no KL)."""
    return dataclasses.replace(params, kl_coef=0.0) if params.kl_coef else params


def _grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the accumulated gradients (before clipping), for engines that do not report one."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
