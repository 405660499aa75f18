"""One learner's training step on one rank: view, advantages, reference log-probs, mini-batch updates.

For learner k and a step's trajectories:

1. the learner's view (own rows and, for ``hacpo`` / ``naive``, foreign rows re-rendered in k's tokens);
2. advantages with ω^(k,j) = R[k, j] in the baseline (eqs. 6–8) and the foreign-row coefficient ω^(j,k) = R[j, k]
   (eq. 10, 1 on own rows);
3. optional reference log-probs of the own rows this rank trains on (the KL term, spec §3.e);
4. mini-batch updates m = 0, 1, ... (eq. 14, ``max_epochs`` passes): this rank's share of each global mini-batch in
   micro-batches with gradient accumulation, then one clipped DeepSpeed optimizer step.

Non-finite losses: a micro-batch whose loss (or log-probs) is NaN/inf contributes no gradient, and the optimizer
update of its mini-batch is skipped on every rank (parameters and Adam moments untouched); ``skipped_updates``
counts them.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from openrlhf_hacpo.actors.learner_metrics import record_loss_metrics, record_view_stats
from openrlhf_hacpo.actors.results import RankTrainResult, StepTimings
from openrlhf_hacpo.algorithms import compute_advantages, get_policy_loss
from openrlhf_hacpo.algorithms.losses import PolicyLossInput
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.models import response_logprobs
from openrlhf_hacpo.rollout import LearnerBatch, LearnerViewConfig, Trajectory, build_learner_batch
from openrlhf_hacpo.utils.padding import pad_values
from openrlhf_hacpo.utils.partition import split_evenly
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["UpdateLoop"]

logger = logging.getLogger(__name__)


class UpdateLoop:
    """The training step of one data-parallel rank of learner ``agent_index``.

    ``loss_fn`` is the registered policy loss of ``cfg.algo.loss_name``; ``reference`` (a Ray actor handle or a
    plain :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker`) must be set when ``kl_coef > 0``.
    """

    def __init__(self, cfg: TrainConfig, agent: AgentConfig, agent_index: int, rank: int, world_size: int,
                 engine: Any, client_optimizer: SkippableAdamW, tokenizer: Any, view_cfg: LearnerViewConfig,
                 device: torch.device) -> None:
        self.cfg, self.agent, self.agent_index = cfg, agent, agent_index
        self.rank, self.world_size = rank, world_size
        self.engine, self.client_optimizer = engine, client_optimizer
        self.tokenizer, self.view_cfg, self.device = tokenizer, view_cfg, device
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.loss_fn = get_policy_loss(cfg.algo.loss_name)
        self.reference: Any = None
        self.updates_done = 0
        self.skipped_updates = 0
        self._last_grad_norm: float | None = None

    # ------------------------------------------------------------------------------------------------ the step
    def train_step(self, trajectories: Sequence[Trajectory], step: int,
                   ratio_matrix: torch.Tensor) -> RankTrainResult:
        """Update the policy on one step's trajectories (every agent's, verified).

        ``ratio_matrix`` is R[a][b] = clip(P̂_a / P̂_b) from the capability tracker (pre-update, shared by
        learners); ``step`` is 1-based.
        """
        t_start = time.perf_counter()
        batch = self.learner_batch(trajectories)
        advantages = self._attach_advantages(batch, torch.as_tensor(ratio_matrix, dtype=torch.float64))
        stats = WeightedMeans()
        record_view_stats(batch, advantages, stats, [a.name for a in self.cfg.resolved_agents()])
        plan = self._plan_updates(batch, step)

        t_ref = time.perf_counter()
        ref_logp = self._reference_logprobs(plan) if self.cfg.algo.loss.uses_kl else {}
        logprob_s = time.perf_counter() - t_ref

        skipped_before = self.skipped_updates
        grad_norms, lrs, foreign_ratios = [], [], []
        for m, minibatch in enumerate(plan):
            grad_norm, lr = self._update(minibatch, m, step, ref_logp, stats, foreign_ratios)
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
        total_s = time.perf_counter() - t_start
        return RankTrainResult(metrics=stats.state(), skipped_updates=self.skipped_updates - skipped_before,
                               skipped_updates_total=self.skipped_updates, updates=len(plan),
                               timings=StepTimings(logprob_s=logprob_s, update_s=total_s - logprob_s))

    def learner_batch(self, trajectories: Sequence[Trajectory]) -> LearnerBatch:
        """This agent's view of a step's trajectories (own rows only for gspo / grpo)."""
        k = self.agent_index
        rows = trajectories if self.cfg.trains_on_foreign else [t for t in trajectories if t.source == k]
        if not any(t.source == k for t in rows):
            raise ValueError(f"agent {self.agent.name!r}: the step holds none of its own trajectories")
        return build_learner_batch(rows, k, self.tokenizer, self.view_cfg, eos_token_id=self.tokenizer.eos_token_id)

    def _attach_advantages(self, batch: LearnerBatch, ratio: torch.Tensor) -> torch.Tensor:
        """Columns ``advantages`` (eqs. 6–8 with ω^(k,j) = R[k, j]), ``coef`` (ω^(j,k) = R[j, k], eq. 10; 1 on own
        rows) and ``row_index``; returns the advantages."""
        k = self.agent_index
        sources = torch.tensor([r.source for r in batch.rows], dtype=torch.long)
        rewards = torch.tensor([r.reward for r in batch.rows], dtype=torch.float64)
        prompt_index = torch.tensor(batch.prompt_index(), dtype=torch.long)
        adv = compute_advantages(rewards, prompt_index, sources, k, ratio[k].clone(), self.cfg.algo.advantage)
        batch.set_column("advantages", adv.advantages)
        batch.set_column("coef", ratio[:, k][sources])
        batch.set_column("row_index", torch.arange(len(batch)))
        return adv.advantages.float()

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
        wanted: dict[int, Any] = {}
        for minibatch in plan:
            share = self._my_share(minibatch)
            for row, index in zip(share.rows, share.columns["row_index"].tolist()):
                if row.is_own:
                    wanted[index] = row
        indices = sorted(wanted)
        args = ([wanted[i].prompt_ids for i in indices], [wanted[i].response_ids for i in indices],
                self.cfg.temperature)
        if hasattr(self.reference.compute_logprobs, "remote"):
            import ray

            values = ray.get(self.reference.compute_logprobs.remote(*args))
        else:
            values = self.reference.compute_logprobs(*args)
        return dict(zip(indices, values))

    # ------------------------------------------------------------------------------------------------ one update
    def _update(self, minibatch: LearnerBatch, m: int, step: int, ref_logp: dict[int, torch.Tensor],
                stats: WeightedMeans, foreign_ratios: list[torch.Tensor]) -> tuple[float | None, float]:
        """One optimizer update on one global mini-batch (this rank's share, in micro-batches); the sequence ratios
        of its foreign rows are appended to ``foreign_ratios``.

        Returns (gradient norm or None when skipped, learning rate of the update).
        """
        engine = self.engine
        own_rows = [r for r in minibatch.rows if r.is_own]
        totals = dict(num_seqs=len(minibatch), num_tokens=minibatch.num_response_tokens,
                      num_own_seqs=len(own_rows), num_own_tokens=sum(len(r.response_ids) for r in own_rows))
        micros = self._my_share(minibatch).micro_batches(self.cfg.micro_train_batch_size)
        lr = float(self.client_optimizer.param_groups[0]["lr"])  # the rate this update uses
        nonfinite = False
        loss_total = 0.0
        for micro in micros:
            loss, out = self.micro_loss(micro, m, totals, ref_logp)
            if out is None:
                nonfinite = True
            else:
                loss_total += float(loss.detach())
                record_loss_metrics(out.metrics, stats)
                if out.ratios is not None:
                    foreign = ~torch.as_tensor([r.is_own for r in micro.rows], dtype=torch.bool)
                    foreign_ratios.append(out.ratios.detach().float().cpu()[foreign])
            # DeepSpeed averages gradients over data-parallel ranks; the loss denominators are global totals
            engine.backward(loss * self.world_size, scale_wrt_gas=False)
            if micro is micros[-1]:
                if not engine.is_gradient_accumulation_boundary():
                    raise RuntimeError(f"agent {self.agent.name!r}: micro-batches of update {m} are out of step "
                                       "with DeepSpeed's gradient accumulation")
                nonfinite = self._any_rank(nonfinite)
                self.client_optimizer.skip_next_step = nonfinite
                if self.agent.zero_stage == 0 and not nonfinite:
                    self._last_grad_norm = _grad_norm(engine.module)
            engine.step()
        self.client_optimizer.skip_next_step = False
        if nonfinite:
            self.skipped_updates += 1
            logger.warning("agent %r step %d update %d: non-finite loss, update skipped (%d skipped so far)",
                           self.agent.name, step, m, self.skipped_updates)
            return None, lr
        self.updates_done += 1
        # each rank holds a share of the mini-batch loss; the merged mean over ranks times world_size is their sum
        stats.add("loss", loss_total * self.world_size, 1.0)
        grad_norm = engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._last_grad_norm
        return (float(grad_norm) if grad_norm is not None else None), lr

    def micro_loss(self, micro: LearnerBatch, m: int, totals: dict[str, int], ref_logp: dict[int, torch.Tensor]):
        """Policy loss of one micro-batch of update ``m``: ``(loss, PolicyLossOutput)``, or ``(zero-gradient
        surrogate, None)`` when the log-probs or the loss are not finite.

        ``totals`` are the global mini-batch's counts (``num_seqs``, ``num_tokens``, ``num_own_seqs``,
        ``num_own_tokens``), the loss's denominators; ``ref_logp`` maps own rows' ``row_index`` to their reference
        log-probs (empty without a KL term).
        """
        cfg = self.cfg
        loss_cfg = cfg.algo.loss
        padded = micro.to_padded(self.pad_token_id, device=self.device)
        scored = response_logprobs(self.engine, padded, cfg.temperature, with_entropy=True, path=cfg.logprob_path,
                                   backend=cfg.kernel_backend)
        logp = scored.logp
        mask = padded["response_mask"]
        if bool(torch.isfinite(logp.detach()[mask > 0]).all()):
            ref = None
            if loss_cfg.uses_kl:  # own rows only; foreign rows and padding hold 0
                rows = [ref_logp[index] if row.is_own else None
                        for row, index in zip(micro.rows, micro.columns["row_index"].tolist())]
                ref = pad_values(rows, mask.shape[1]).to(self.device)
            token_level = cfg.algo.token_level_ratios
            out = self.loss_fn(PolicyLossInput(
                logp=logp, mask=mask, advantages=padded["advantages"], old_logp_mean=padded["old_logp_mean"],
                is_own=padded["is_own"], coef=padded["coef"], update_index=m,
                old_logp=padded["old_logp"] if token_level else None, ref_logp=ref, **totals,
            ), loss_cfg, backend=cfg.kernel_backend)
            # mean entropy of the next-token distribution over this micro-batch's response tokens
            out.metrics["entropy"] = float((scored.entropy * mask).sum() / mask.sum().clamp(min=1))
            if bool(torch.isfinite(out.loss.detach())):
                return out.loss, out
        # a zero loss built from the forward outputs: every rank runs backward through the same graph (ZeRO-3's
        # gather/reduce hooks stay in step) and no gradient reaches the parameters
        return (torch.nan_to_num(logp, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum(), None

    def _any_rank(self, flag: bool) -> bool:
        """True on every rank of this agent when ``flag`` is True on any (all ranks skip an update together)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item() > 0)


def _grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the accumulated gradients (before clipping), for engines that do not report one."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
