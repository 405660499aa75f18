"""What a learner's updates computed on one rank: rows and tokens trained, those that reached a backward pass, and
the packed positions (real and padding) of the update's and the probe's forwards."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from openrlhf_hacpo.rollout import MicroBatch
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["UpdateWork"]


@dataclass
class UpdateWork:
    """Counts summed over micro-batches (this rank), all read on the host from the micro-batches' row lengths."""

    rows: int = 0
    tokens: int = 0
    rows_backward: int = 0
    tokens_backward: int = 0
    positions_update: int = 0  # packed positions B·(P+R) of the micro-batches with gradient
    real_update: int = 0
    positions_probe: int = 0
    real_probe: int = 0
    rows_backward_index: list[int] = dataclasses.field(default_factory=list)  # row_index of those rows_backward

    def add(self, other: "UpdateWork") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def count_backward(self, micro: MicroBatch) -> None:
        """A micro-batch that goes through a forward with gradient and a backward pass."""
        self.rows_backward += len(micro.rows)
        self.rows_backward_index += list(micro.rows)
        self.tokens_backward += micro.num_tokens
        self.positions_update += micro.positions
        self.real_update += micro.real_positions

    def count_probe(self, micro: MicroBatch) -> None:
        """A micro-batch of the probe (a forward without gradient)."""
        self.positions_probe += micro.positions
        self.real_probe += micro.real_positions

    def record(self, stats: WeightedMeans, world_size: int) -> None:
        """Rows and tokens trained and those that reached a backward pass (sums over ranks, per step), and the
        padding share of the update's and the probe's packed positions."""
        w = float(world_size)
        stats.add("perf/rows_trained", self.rows * w, 1.0)
        stats.add("perf/tokens_trained", self.tokens * w, 1.0)
        stats.add("perf/rows_backward", self.rows_backward * w, 1.0)
        stats.add("perf/tokens_backward", self.tokens_backward * w, 1.0)
        if self.positions_update:
            stats.add("perf/pad_frac_update", 1.0 - self.real_update / self.positions_update,
                      float(self.positions_update))
        if self.positions_probe:
            stats.add("perf/pad_frac_probe", 1.0 - self.real_probe / self.positions_probe,
                      float(self.positions_probe))
