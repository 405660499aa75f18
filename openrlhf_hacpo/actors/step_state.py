"""The state of one learner's training step on one rank while it runs: what was prepared (view, advantages, plan,
reference log-probs), the update in progress and what the updates have recorded so far."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.algorithms import LossTotals
from openrlhf_hacpo.rollout import LearnerBatch
from openrlhf_hacpo.utils.timing import PhaseTimer
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["PreparedStep", "StepRecords", "UpdateState"]


@dataclass
class StepRecords:
    """What a step's updates have recorded so far on this rank."""

    skipped_before: int
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    foreign_ratios: list[torch.Tensor] = field(default_factory=list)  # on the device until the step's end
    work: UpdateWork = field(default_factory=UpdateWork)

    def add(self, grad_norm: float | None, lr: float) -> None:
        """An update's result: its gradient norm (None when skipped) and learning rate."""
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
        self.lrs.append(lr)

    def record(self, stats: WeightedMeans, world_size: int, device: torch.device) -> None:
        """The step's gradient norms, the median foreign ratio, the last learning rate, the work and (CUDA) the peak
        memory, as weighted means."""
        for g in self.grad_norms:
            stats.add("grad_norm", g, 1.0)
        if self.foreign_ratios:  # median of s over this rank's foreign rows (ranks' medians are averaged); one read
            foreign_s = torch.cat(self.foreign_ratios).float()
            stats.add("policy/foreign_ratio_median", foreign_s.median().item(), float(foreign_s.numel()))
        stats.add("lr", self.lrs[-1] if self.lrs else 0.0, 1.0)
        self.work.record(stats, world_size)
        if device.type == "cuda":  # this rank's peak so far (ranks' peaks are averaged when merged)
            stats.add("perf/cuda_max_allocated_gib", torch.cuda.max_memory_allocated(device) / 2**30, 1.0)


@dataclass
class PreparedStep:
    """A step's view, advantages, update plan and reference log-probs, with its timer and records."""

    batch: LearnerBatch
    advantages: torch.Tensor
    plan: list[LearnerBatch]
    ref_logp: dict[int, torch.Tensor]
    step: int
    timer: PhaseTimer
    stats: WeightedMeans
    records: StepRecords


@dataclass
class UpdateState:
    """One optimizer update in progress on this rank: its rows, loss settings and what it has recorded so far."""

    m: int
    share: LearnerBatch
    totals: LossTotals
    params: Any
    ref_logp: dict[int, torch.Tensor]
    stats: WeightedMeans
    foreign_ratios: list[torch.Tensor]
    lr: float
    work: UpdateWork
    terms: dict[str, float] = field(default_factory=lambda: {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0})
    nonfinite: bool = False
