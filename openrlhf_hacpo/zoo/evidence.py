"""Statistics for comparisons of tiny runs paired by seed: intervals, exact sign-flip tests, Holm's correction, the
area under a validation curve.

Runs of two arms with the same seed see the same prompt batches, so an arm is compared with another through the
per-seed differences d_1..d_n of a figure (the final accuracy):

* mean d̄, sample std s, and the 95% t-interval d̄ ± t_{0.975, n−1} · s / √n;
* the exact two-sided sign-flip p-value: under the null hypothesis each d_i is as likely to be +|d_i| as −|d_i|, so
  p = #{ε ∈ {±1}^n : |Σ ε_i d_i| ≥ |Σ d_i|} / 2^n (all 2^n patterns; at n = 5 the smallest p is 2/32 = 0.0625, at
  n = 10 it is 2/1024 ≈ 0.002);
* Holm's step-down correction over a family of m p-values: sorted p_(1) ≤ ... ≤ p_(m), adjusted
  p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)).

Pure functions of plain numbers; the t quantile is :func:`openrlhf_hacpo.zoo.reference.student_t_quantile`.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from openrlhf_hacpo.zoo.reference import student_t_quantile

__all__ = ["curve_auc", "holm", "paired_summary", "sign_flip_p"]


def sign_flip_p(diffs: Sequence[float]) -> float | None:
    """Exact two-sided sign-flip p-value of the paired differences (all 2^n sign patterns; n ≤ 24)."""
    d = np.asarray(list(diffs), dtype=np.float64)
    n = d.size
    if n == 0:
        return None
    if n > 24:
        raise ValueError(f"the exact sign-flip test enumerates 2^n patterns; n = {n} is too many (at most 24)")
    observed = abs(d.sum())
    patterns = np.arange(2 ** n, dtype=np.int64)
    signs = 1.0 - 2.0 * ((patterns[:, None] >> np.arange(n)) & 1)  # [2^n, n] of ±1
    sums = np.abs(signs @ d)
    # a tolerance of float rounding: the pattern of all +1 (and all -1) must count itself
    return float(np.count_nonzero(sums >= observed - 1e-12 * max(1.0, np.abs(d).sum())) / 2 ** n)


def paired_summary(diffs: Sequence[float], level: float = 0.95) -> dict[str, float | int | None]:
    """n, mean, sample std, the ``level`` t-interval of the mean, the exact sign-flip p-value and the number of
    positive differences."""
    d = [float(x) for x in diffs]
    n = len(d)
    out: dict[str, float | int | None] = {"n": n, "mean": None, "std": None, "ci_low": None, "ci_high": None,
                                          "p_sign_flip": sign_flip_p(d), "positive": sum(x > 0 for x in d)}
    if n == 0:
        return out
    mean = sum(d) / n
    out["mean"] = mean
    if n > 1:
        std = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        half = student_t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n)
        out.update(std=std, ci_low=mean - half, ci_high=mean + half)
    return out


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values of a family ``{name: p}`` (module docstring)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m = len(order)
    adjusted: dict[str, float] = {}
    running = 0.0
    for j, key in enumerate(order):
        running = max(running, min(1.0, (m - j) * pvalues[key]))
        adjusted[key] = running
    return adjusted


def curve_auc(curve: Sequence[Sequence[float]]) -> float | None:
    """The area under a validation curve ``[(step, accuracy), ...]`` divided by its span of steps: the mean accuracy
    over training (trapezoids between evaluations); a single point is its own value."""
    points = sorted((float(s), float(a)) for s, a in curve)
    if not points:
        return None
    if len(points) == 1 or points[-1][0] == points[0][0]:
        return points[-1][1]
    area = sum((s1 - s0) * (a0 + a1) / 2.0 for (s0, a0), (s1, a1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])
