"""The unbiased pass@k estimate of one prompt (Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
eq. 1), shared by the trainer's periodic evaluation, the tiny job's evaluation and the paper-reproduction metrics.

With n sampled responses of which c are correct,

    pass@k = 1 - C(n - c, k) / C(n, k),    1 <= k <= n,

the probability that a k-subset drawn without replacement from the n responses holds at least one correct one; it is
1 as soon as n - c < k.
"""
from __future__ import annotations

import math

__all__ = ["pass_at_k"]


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one prompt: 1 − C(n − c, k) / C(n, k) for n samples of which c are correct."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"k must be in [1, {num_samples}], got {k}")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be in [0, {num_samples}], got {num_correct}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)
