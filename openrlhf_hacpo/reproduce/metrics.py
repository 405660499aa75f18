"""Evaluation metrics of the paper: mean@k, verl's bootstrap best@k, its closed form, the unbiased pass@k.

For one prompt with n sampled rewards r_1..r_n (c of them correct, i.e. > 0):

* **mean@n** = (1/n) Σ r_i. With greedy decoding and n = 1 this is the paper's avg@1.
* **best@k, verl's bootstrap** (``process_validation_metrics``): draw k indices with replacement from {0..n-1},
  ``n_bootstrap = 1000`` times, from a numpy ``RandomState`` seeded with 42 **for every prompt** (so every prompt
  sees the same index draws); take the max reward of each draw and average the maxima. The paper's AIME 2025
  best@30 is this number with n = k = 30.
* **best@k, expected value** of the same draw: with the rewards sorted, v_(1) <= ... <= v_(n),

      E[max] = Σ_j v_(j) [(j/n)^k - ((j-1)/n)^k],                                   (closed form)

  which for 0/1 rewards is 1 - (1 - c/n)^k. The bootstrap estimates it with a standard error of at most
  0.5/sqrt(1000) per prompt.
* **pass@k, unbiased** (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), equal to 1 as soon as n - c < k; it is *not*
  the paper's best@k (pass@30 with n = 30 is just "any sample correct").

A benchmark's value is the mean over its prompts, in the order the prompts first appear (as verl averages them).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from openrlhf_hacpo.utils.pass_at_k import pass_at_k

__all__ = [
    "BenchmarkMetrics",
    "ScoredSample",
    "aggregate_by_data_source",
    "best_at_k_bootstrap",
    "best_at_k_expected",
    "benchmark_metrics",
    "mean_at_k",
    "pass_at_k",
]

VERL_BOOTSTRAP_DRAWS = 1000
VERL_BOOTSTRAP_SEED = 42


def mean_at_k(rewards: Sequence[float]) -> float:
    """mean@n of one prompt: the plain mean of its n rewards."""
    if len(rewards) == 0:
        raise ValueError("mean@k needs at least one reward")
    return float(np.mean(np.asarray(rewards, dtype=np.float64)))


@lru_cache(maxsize=16)
def _bootstrap_indices(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """verl's index draws: ``n_bootstrap`` calls of ``choice(n, size=k, replace=True)`` on a fresh seeded stream."""
    rng = np.random.RandomState(seed)
    draws = np.stack([rng.choice(n, size=k, replace=True) for _ in range(n_bootstrap)])
    draws.setflags(write=False)
    return draws


def best_at_k_bootstrap(rewards: Sequence[float], k: int, n_bootstrap: int = VERL_BOOTSTRAP_DRAWS,
                        seed: int = VERL_BOOTSTRAP_SEED) -> float:
    """verl's best@k/mean of one prompt: mean over ``n_bootstrap`` seeded draws of the max of k resampled rewards."""
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"best@k needs a non-empty list of rewards, got shape {values.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be >= 1, got {n_bootstrap}")
    maxima = values[_bootstrap_indices(len(values), k, n_bootstrap, seed)].max(axis=1)
    return float(np.mean(maxima))


def best_at_k_expected(rewards: Sequence[float], k: int) -> float:
    """Exact expectation of verl's best@k draw (closed form in the module docstring); 1 − (1 − c/n)^k for 0/1."""
    values = np.sort(np.asarray(rewards, dtype=np.float64))
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"best@k needs a non-empty list of rewards, got shape {values.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = len(values)
    cdf = (np.arange(n + 1, dtype=np.float64) / n) ** k
    return float(np.dot(values, np.diff(cdf)))


@dataclass(frozen=True)
class ScoredSample:
    """One scored response: which benchmark, which prompt, its reward."""

    data_source: str
    prompt_id: str
    reward: float


@dataclass(frozen=True)
class BenchmarkMetrics:
    """The metrics of one benchmark (one ``data_source``) with n samples per prompt and k = ``k``.

    ``best_at_k``, ``best_at_k_expected`` and ``pass_at_k`` are None when n = 1 (greedy avg@1 only).
    """

    data_source: str
    num_prompts: int
    num_samples: int
    k: int
    mean_at_n: float
    best_at_k: float | None
    best_at_k_expected: float | None
    pass_at_k: float | None

    def named(self) -> dict[str, float]:
        """Metric name → value, named as verl names them (``mean@30``, ``best@30``, ...)."""
        out = {f"mean@{self.num_samples}": self.mean_at_n}
        if self.best_at_k is not None:
            out[f"best@{self.k}"] = self.best_at_k
            out[f"best@{self.k}/expected"] = self.best_at_k_expected
            out[f"pass@{self.k}"] = self.pass_at_k
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _group(samples: Iterable[ScoredSample | dict]) -> dict[str, dict[str, list[float]]]:
    groups: dict[str, dict[str, list[float]]] = {}
    for i, s in enumerate(samples):
        if isinstance(s, dict):
            try:
                s = ScoredSample(str(s["data_source"]), str(s["prompt_id"]), s["reward"])
            except KeyError as err:
                raise ValueError(f"scored sample {i} has no {err.args[0]!r} field") from err
        reward = float(s.reward)
        if not math.isfinite(reward):
            raise ValueError(f"scored sample {i} ({s.data_source} {s.prompt_id}) has a non-finite reward {reward}")
        groups.setdefault(s.data_source, {}).setdefault(s.prompt_id, []).append(reward)
    return groups


def benchmark_metrics(data_source: str, prompt_rewards: dict[str, list[float]], k: int | None = None,
                      n_bootstrap: int = VERL_BOOTSTRAP_DRAWS, seed: int = VERL_BOOTSTRAP_SEED) -> BenchmarkMetrics:
    """Metrics of one benchmark from ``prompt_id → rewards`` (every prompt with the same number n of samples).

    ``k`` defaults to n. A reward > 0 counts as correct for pass@k.
    """
    if not prompt_rewards:
        raise ValueError(f"benchmark {data_source!r} has no scored samples")
    sizes = {len(v) for v in prompt_rewards.values()}
    if len(sizes) != 1:
        uneven = sorted(prompt_rewards, key=lambda p: len(prompt_rewards[p]))
        raise ValueError(
            f"benchmark {data_source!r}: prompts have different sample counts {sorted(sizes)} "
            f"(e.g. {uneven[0]!r}: {len(prompt_rewards[uneven[0]])}, {uneven[-1]!r}: {len(prompt_rewards[uneven[-1]])})"
        )
    n = sizes.pop()
    k = n if k is None else k
    if not 1 <= k <= n:
        raise ValueError(f"benchmark {data_source!r}: k must be in [1, {n}], got {k}")
    rows = list(prompt_rewards.values())
    mean_n = float(np.mean([mean_at_k(r) for r in rows]))
    if n == 1:
        return BenchmarkMetrics(data_source, len(rows), n, k, mean_n, None, None, None)
    return BenchmarkMetrics(
        data_source=data_source,
        num_prompts=len(rows),
        num_samples=n,
        k=k,
        mean_at_n=mean_n,
        best_at_k=float(np.mean([best_at_k_bootstrap(r, k, n_bootstrap, seed) for r in rows])),
        best_at_k_expected=float(np.mean([best_at_k_expected(r, k) for r in rows])),
        pass_at_k=float(np.mean([pass_at_k(n, sum(1 for x in r if x > 0), k) for r in rows])),
    )


def aggregate_by_data_source(samples: Iterable[ScoredSample | dict], k: int | None = None,
                             n_bootstrap: int = VERL_BOOTSTRAP_DRAWS,
                             seed: int = VERL_BOOTSTRAP_SEED) -> dict[str, BenchmarkMetrics]:
    """Group scored samples (dataclasses or dicts with ``data_source``, ``prompt_id``, ``reward``) by benchmark and
    prompt, and compute each benchmark's metrics (:func:`benchmark_metrics`), in first-seen order."""
    return {
        source: benchmark_metrics(source, prompts, k, n_bootstrap, seed)
        for source, prompts in _group(samples).items()
    }
