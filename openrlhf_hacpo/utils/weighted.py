"""Weighted means of named metrics, accumulated over micro-batches and updates and merged over ranks.

A metric ``key`` with values v_i and weights w_i reports Σ_i w_i v_i / Σ_i w_i. Each rank keeps the two sums per
key (:meth:`WeightedMeans.state`); :func:`merge_weighted` adds the sums of every rank before dividing, so the merged
figure is the weighted mean over all ranks' values, not a mean of the ranks' means.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

__all__ = ["WeightedMeans", "merge_weighted"]

WeightedState = dict[str, tuple[float, float]]
"""key -> (Σ w v, Σ w): what a rank sends to be merged (plain floats, so it pickles anywhere)."""


class WeightedMeans:
    """Running Σ w v and Σ w per key; values with a non-positive weight or a non-finite value are left out."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        if weight > 0 and math.isfinite(value):
            self.sums[key] += value * weight
            self.weights[key] += weight

    def state(self) -> WeightedState:
        return {k: (self.sums[k], self.weights[k]) for k in self.sums}


def merge_weighted(states: Sequence[WeightedState]) -> dict[str, float]:
    """Weighted means over several :meth:`WeightedMeans.state` (ranks): Σ sums / Σ weights per key."""
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for state in states:
        for key, (s, w) in state.items():
            sums[key] += s
            weights[key] += w
    return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}
