"""What the workers and agent groups hand back: one small frozen type per call, never a string-keyed dict.

A policy rank returns :class:`WorkerInfo` from setup, :class:`RolloutResult` from a rollout (or the scoring of
responses sampled by the engines) and :class:`RankTrainResult` from a training step; the agent's group combines
its ranks' results into one :class:`RolloutResult` and one :class:`TrainStepResult` per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from openrlhf_hacpo.rollout import Trajectory
from openrlhf_hacpo.utils.timing import slowest
from openrlhf_hacpo.utils.weighted import WeightedState, merge_weighted

__all__ = ["RankTrainResult", "RolloutResult", "TrainStepResult", "WorkerInfo", "WorkerResources"]


@dataclass(frozen=True)
class WorkerInfo:
    """Facts a policy rank reports once set up (logged by the controller)."""

    agent: str
    rank: int
    num_parameters: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    device: str


@dataclass(frozen=True)
class WorkerResources:
    """What a policy rank holds, asked for on demand (benchmarks): its parameters (all, and those that train: the
    adapter's with LoRA; under ZeRO-3 the full count, not the rank's partition) and its process's resident memory,
    the peak since the process started and the present one (``None`` where the platform does not say)."""

    agent: str
    rank: int
    parameters: int
    trainable_parameters: int
    peak_rss_bytes: int
    rss_bytes: int | None
    memory_source: str


@dataclass(frozen=True)
class RolloutResult:
    """An agent's (or one rank's) sampled and scored trajectories of a step, with the phase's costs.

    ``timings`` holds the seconds of the rollout's phases (:class:`~openrlhf_hacpo.utils.timing.PhaseTimer`):
    ``generate`` (prompt rendering and sampling) and ``scoring`` (the old-log-prob recompute that makes the
    trajectories); once combined, the slowest rank's each. A phase a part did not run is absent: a rank that scores
    the engines' responses has no ``generate`` (its agent group measures the engines' generation).
    ``generated_tokens`` counts the sampled response tokens; ``scoring_positions`` / ``scoring_tokens`` the token
    positions the scoring pass computed and the real tokens among them (their ratio gives its padding fraction).
    ``mismatch_rows``: per own row, its engine-vs-trainer log-prob summary
    (:func:`~openrlhf_hacpo.algorithms.mismatch.row_summaries`: tokens, Σ|d|, max|d|, Σ k3, Σ d); empty when the
    engine returned no log-probs or nothing was scored.
    """

    trajectories: tuple[Trajectory, ...]
    timings: dict[str, float]
    generated_tokens: int
    scoring_positions: int = 0
    scoring_tokens: int = 0
    mismatch_rows: tuple[tuple[float, ...], ...] = ()

    @staticmethod
    def combine(parts: Sequence["RolloutResult"]) -> "RolloutResult":
        """The ranks' results as one: trajectories in rank order, the slowest rank's time per phase, the token
        counts summed."""
        return RolloutResult(
            trajectories=tuple(t for p in parts for t in p.trajectories),
            timings=slowest([p.timings for p in parts]),
            generated_tokens=sum(p.generated_tokens for p in parts),
            scoring_positions=sum(p.scoring_positions for p in parts),
            scoring_tokens=sum(p.scoring_tokens for p in parts),
            mismatch_rows=tuple(r for p in parts for r in p.mismatch_rows),
        )


@dataclass(frozen=True)
class RankTrainResult:
    """One rank's training step: metric sums to merge (:mod:`openrlhf_hacpo.utils.weighted`), update counts and
    the seconds of its phases (``view``, ``advantages``, ``reference``, ``probe``, ``update``;
    :class:`~openrlhf_hacpo.utils.timing.PhaseTimer`)."""

    metrics: WeightedState
    skipped_updates: int
    skipped_updates_total: int
    updates: int
    timings: dict[str, float]
    old_logp_sums: dict[int, tuple[float, int]] = field(default_factory=dict)
    """``old_logp_from_update`` without an exchange (gspo, grpo): this rank's own rows' old log-prob sums and token
    counts by trajectory position (:func:`~openrlhf_hacpo.actors.first_update.old_logp_sums`)."""


@dataclass(frozen=True)
class TrainStepResult:
    """A learner's training step over all its ranks: merged weighted-mean metrics and update counts.

    ``skipped_updates`` counts this step's skipped (non-finite) updates, ``skipped_updates_total`` the run's;
    ``updates`` is the number of mini-batch updates the step planned; ``timings`` the slowest rank's seconds per
    phase; ``old_logp_sums`` every rank's :attr:`RankTrainResult.old_logp_sums`.
    """

    metrics: dict[str, float]
    skipped_updates: int
    skipped_updates_total: int
    updates: int
    timings: dict[str, float]
    old_logp_sums: dict[int, tuple[float, int]] = field(default_factory=dict)

    @staticmethod
    def combine(parts: Sequence[RankTrainResult]) -> "TrainStepResult":
        """Ranks skip together, so rank 0's counts stand for all; metrics merge, times are the slowest rank's."""
        return TrainStepResult(
            metrics=merge_weighted([p.metrics for p in parts]),
            skipped_updates=parts[0].skipped_updates,
            skipped_updates_total=parts[0].skipped_updates_total,
            updates=parts[0].updates,
            timings=slowest([p.timings for p in parts]),
            old_logp_sums={pos: v for p in parts for pos, v in p.old_logp_sums.items()},
        )
