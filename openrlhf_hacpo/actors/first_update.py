"""Old log-probs without a scoring pass (``old_logp_from_update``): own rows of a step's first update take them from
that update's forward.

The old log-probs of a step are the pre-step policy's, log π_θ_old(y), and the parameters do not change before the
first optimizer step. So learner k's forward of its own rows at update m = 0 (with gradient) computes exactly the
values a scoring pass would (up to the order of float sums): the loss of those rows uses them detached as its old
log-probs (ratio s = 1 at m = 0, as with a scoring pass), and only own rows that first appear in a later update
are scored, without gradient, before the first optimizer step. Exact only for a policy without dropout, which is
checked.

Under ``hacpo`` and ``naive`` a source's old log-prob mean is also the denominator of every other learner's ratio on
its rows (eq. 11), needed before their probes decide. The step therefore runs in two phases:

1. :func:`own_rows_first`: every learner builds its view, forwards and backwards its own rows of update 0 (no
   optimizer step: gradients accumulate), scores its own rows of later updates, and returns a :class:`FirstPhase`:
   these per-token values, keyed by the trajectory's position in the step, and the step so far;
2. the controller records them in the trajectories (:func:`record_old_logps`: each row's sum and token count, not
   the per-token values, cross the process boundary) and hands every learner each trajectory's ``old_logp_mean``;
   :func:`finish_step` then takes the learner's :class:`FirstPhase`, probes the foreign rows of update 0, runs the
   kept ones through the backward pass, takes the optimizer step and runs updates m = 1, 2, ... as usual.

Under ``gspo`` and ``grpo`` no learner reads another's old log-probs, so there is no exchange: each learner runs
both phases in one call (:meth:`UpdateLoop.train_step`) and hands its rows' sums back with the step's result, for
the trajectories the driver keeps (rollout dumps).

Both phases use only the learner's public steps (:class:`~openrlhf_hacpo.actors.update_steps.UpdateSteps`).
Nothing in the loss depends on the split: its denominators are the global mini-batch totals (``LossTotals``), the
same whichever rows the probe keeps and whichever phase a row's backward runs in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import torch

from openrlhf_hacpo.actors.learner_metrics import record_view_stats
from openrlhf_hacpo.actors.micro_loss import zero_surrogate
from openrlhf_hacpo.actors.rank_agreement import agree_on_count
from openrlhf_hacpo.actors.results import RankTrainResult
from openrlhf_hacpo.actors.step_state import PreparedStep, UpdateState
from openrlhf_hacpo.actors.update_plan import my_share
from openrlhf_hacpo.actors.update_steps import UpdateSteps
from openrlhf_hacpo.actors.zero_grad_probe import probe_enabled
from openrlhf_hacpo.algorithms import CapabilityRatios
from openrlhf_hacpo.rollout import LearnerBatch, MicroBatch, Trajectory
from openrlhf_hacpo.utils.padding import micro_batch_groups

__all__ = ["FirstPhase", "check_dropout_free", "finish_step", "old_logp_sums", "old_means_of", "own_rows_first",
           "record_old_logps"]


@dataclass
class FirstPhase:
    """A step between its two phases on one rank: ``old_logps``, the old log-probs of this rank's own rows by
    trajectory position (float32 CPU tensors of the action tokens), and what :func:`finish_step` continues from
    (what phase 1 prepared, the first update with its gradients accumulated)."""

    old_logps: dict[int, torch.Tensor]
    prepared: PreparedStep
    update: UpdateState
    positions: list[int]  # row index of the learner's view -> the trajectory's position in the step


def check_dropout_free(model: torch.nn.Module, agent: str) -> None:
    """Refuse a policy with active dropout: its training-mode forward would not give the old log-probs."""
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    config = getattr(model, "config", None)
    rates += [v for k in ("attention_dropout", "hidden_dropout", "dropout") if (v := getattr(config, k, 0) or 0) > 0]
    if rates:
        raise ValueError(f"agent {agent!r}: --old_logp_from_update needs a policy without dropout (found rate "
                         f"{rates[0]}); drop the flag to score old log-probs in a pass of their own")


def own_rows_first(loop: UpdateSteps, trajectories: Sequence[Trajectory], step: int,
                   ratios: CapabilityRatios) -> FirstPhase:
    """Phase 1 on one rank: the old log-probs of this rank's own rows and the step so far; the first update's own
    rows have been through forward and backward."""
    prepared = loop.prepare(trajectories, step, ratios)
    k = loop.agent_index
    positions = [i for i, t in enumerate(trajectories) if loop.cfg.trains_on_foreign or t.source == k]
    batch, plan = prepared.batch, prepared.plan
    update = loop.begin_update(plan[0], 0, prepared.ref_logp, prepared.stats, prepared.records.foreign_ratios)
    first = set(update.share.row_ids)
    shares = [my_share(mb, loop.rank, loop.world_size) for mb in plan[1:]]
    later = sorted({i for share in shares for i, r in zip(share.row_ids, share.rows) if r.is_own and i not in first})
    with prepared.timer.phase("update"):
        values = _score(loop, batch.select(later), filler=update.share)
        own = [j for j, r in enumerate(update.share.rows) if r.is_own]
        computed: list[tuple[tuple[int, ...], torch.Tensor]] = []
        # without foreign rows (gspo, grpo) the update is complete here: its last micro-batch is the boundary
        loop.backward(update, update.share.select(own), boundary=not loop.cfg.trains_on_foreign,
                      micro_loss=lambda micro: _own_micro_loss(loop, update, micro, computed))
        for rows, logp in computed:
            logp = logp.float().cpu()
            values.update({i: logp[j, :len(batch.rows[i].response_ids)].clone() for j, i in enumerate(rows)})
    for i, v in values.items():  # this rank's later updates read them from the rows
        batch.rows[i].old_logp = v
    return FirstPhase({positions[i]: v for i, v in values.items()}, prepared, update, positions)


def finish_step(loop: UpdateSteps, pending: FirstPhase | None, old_means: Sequence[float]) -> RankTrainResult:
    """Phase 2 on one rank, from ``pending`` (what :func:`own_rows_first` returned on this rank): ``old_means[p]``
    is the old log-prob mean of the step's trajectory p (every source's); the foreign rows of update 0 are probed
    and trained, the optimizer steps, and the later updates run."""
    if pending is None:
        raise RuntimeError(f"agent {loop.agent.name!r}: finish_step without own_rows_first")
    prepared, update = pending.prepared, pending.update
    batch = prepared.batch
    for row, p in zip(batch.rows, pending.positions):
        row.old_logp_mean = float(old_means[p])
        if not math.isfinite(row.old_logp_mean):
            raise ValueError(f"agent {loop.agent.name!r}: no finite old log-prob mean for trajectory {p} "
                             f"({row.prompt_id!r} from agent {row.source})")
    loop.check_batch(batch)
    record_view_stats(batch, prepared.advantages, prepared.stats, [a.name for a in loop.cfg.resolved_agents])
    foreign = [j for j, r in enumerate(update.share.rows) if not r.is_own]
    timer = prepared.timer
    if loop.cfg.trains_on_foreign:  # else phase 1 took the optimizer step
        if probe_enabled(loop.cfg):
            with timer.phase("probe"):
                keep = set(loop.rows_to_train(update, foreign))
            foreign = [j for j in foreign if j in keep]
        with timer.phase("update"):
            loop.backward(update, update.share.select(foreign), boundary=True)
    prepared.records.add(*loop.finish_update(update, prepared.step, prepared.records.work))
    return loop.run_updates(prepared, first=1)


def old_logp_sums(values: Mapping[int, torch.Tensor]) -> dict[int, tuple[float, int]]:
    """Per-token old log-probs by trajectory position -> (their exact sum, their count): what leaves the learner."""
    return {p: (math.fsum(v.tolist()), len(v)) for p, v in values.items()}


def record_old_logps(trajectories: Sequence[Trajectory],
                     parts: Sequence[Mapping[int, tuple[float, int]]]) -> list[float]:
    """The controller's side of the exchange: every learner's :func:`old_logp_sums` (trajectory position -> sum and
    count of the action tokens' old log-probs) recorded in the step's trajectories; returns each trajectory's
    ``old_logp_mean``."""
    for part in parts:
        for p, (total, count) in part.items():
            if trajectories[p].source_logp_sum is None:
                trajectories[p].set_old_logp_sum(total, count)
    missing = [p for p, t in enumerate(trajectories) if t.source_logp_sum is None]
    if missing:
        t = trajectories[missing[0]]
        raise RuntimeError(f"{len(missing)} trajectories were not scored by their learner, e.g. "
                           f"{t.prompt_id!r} from agent {t.source}")
    return [t.old_logp_mean for t in trajectories]


def old_means_of(trajectories: Sequence[Trajectory], own: Mapping[int, torch.Tensor]) -> list[float]:
    """Each trajectory's old log-prob mean for a learner trained alone (no exchange): its own rows' from ``own``,
    the others' from the trajectories (which must be scored)."""
    means = []
    for p, t in enumerate(trajectories):
        if p in own:
            means.append(math.fsum(own[p].tolist()) / len(own[p]))
        elif t.source_logp_sum is None:
            means.append(math.nan)  # a row this learner does not train on (gspo / grpo), or not scored
        else:
            means.append(t.old_logp_mean)
    return means


# ------------------------------------------------------------------------------------------------ helpers
def _own_micro_loss(loop: UpdateSteps, update: UpdateState, micro: MicroBatch,
                    computed: list[tuple[tuple[int, ...], torch.Tensor]]) -> tuple[torch.Tensor, Any]:
    """The loss of own rows of update 0 whose old log-probs are this forward's, detached; keeps them in
    ``computed`` (on the device, read once the phase ends)."""
    scored = loop.forward(micro, with_entropy=True)
    mask = micro.response_mask
    old = scored.logp.detach() * mask
    micro = replace(micro, old_logp=old, old_logp_mean=old.sum(dim=1) / mask.sum(dim=1))
    computed.append((micro.rows, old))
    out = loop.loss_of(micro, scored.logp, scored.entropy, update.m, update.totals, update.ref_logp, update.params)
    return (out.loss, out) if out is not None else (zero_surrogate(scored.logp), None)


@torch.no_grad()
def _score(loop: UpdateSteps, rows: LearnerBatch, filler: LearnerBatch) -> dict[int, torch.Tensor]:
    """Old log-probs of ``rows`` (own rows of later updates), without gradient, by row index; every rank runs the
    same number of forwards (ZeRO-3's gathers are collective: a rank with fewer forwards one row of ``filler``)."""
    cfg = loop.cfg
    groups = micro_batch_groups([len(r.prompt_ids) for r in rows.rows], [len(r.response_ids) for r in rows.rows],
                                cfg.train.micro_train_batch_size, cfg.compute.length_grouping) if len(rows) else []
    count = agree_on_count(len(groups), loop.world_size, loop.device)
    out: dict[int, torch.Tensor] = {}
    for g in range(count):
        if g >= len(groups):
            loop.forward(filler.select([0]).packed(loop.pad_token_id, loop.device))
            continue
        part = rows.select(groups[g])
        logp = loop.forward(part.packed(loop.pad_token_id, loop.device)).logp.float().cpu()
        out.update({i: logp[j, :len(r.response_ids)].clone() for j, (i, r) in enumerate(zip(part.row_ids, part.rows))})
    return out
