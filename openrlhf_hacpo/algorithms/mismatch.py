"""Training–inference mismatch: how far the engine that sampled a response (π_engine) and the learner's recompute of
the same tokens (π_train, the scoring pass's old log-probs) disagree.

For each response i of an agent's own rows, over its sampled tokens t = 1..n_i (EOS included when sampled), let

    d_it = logp_train(y_it) − logp_engine(y_it)

(both at temperature 1, untruncated). The figures, over all tokens N = Σ n_i of the rows:

* ``mean_abs``  = (1/N) Σ_it |d_it|                          mean absolute log-prob gap per token
* ``max_abs``   = max_it |d_it|
* ``k3_kl``     = (1/N) Σ_it (exp(d_it) − d_it − 1)          the k3 estimator of KL(π_engine ‖ π_train): the tokens
  were sampled from π_engine and exp(d) = π_train / π_engine (verl, TRL and ms-swift use the same estimator); ≥ 0
* ``seq_log_ratio_mean`` / ``seq_log_ratio_std``: mean and population std (ddof 0) over the responses of the
  length-normalised sequence log-ratio s_i = (1/n_i) Σ_t d_it (a token MEAN per sequence, not a sum)
* ``ppl_ratio`` = exp(mean NLL_train − mean NLL_engine) = exp(−(1/N) Σ_it d_it), with both NLL means taken over all
  N tokens together (token-weighted, not a mean of per-sequence perplexities); > 1: the trainer finds the sampled
  text less likely than the engine did

Rows are summarised one by one (:func:`row_summaries`: tokens, Σ|d|, max|d|, Σ k3, Σ d), so ranks and engines can
send a few floats per row and :func:`summarize` merges any concatenation of them.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from openrlhf_hacpo.utils.padding import pad_values

__all__ = ["MISMATCH_KEYS", "row_summaries", "row_summaries_ragged", "summarize"]

MISMATCH_KEYS = ("mean_abs", "max_abs", "k3_kl", "seq_log_ratio_mean", "seq_log_ratio_std", "ppl_ratio")
"""The figures of :func:`summarize`, logged as ``mismatch/<key>``."""


def row_summaries(train_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row ``[tokens, Σ|d|, max|d|, Σ k3, Σ d]`` (float64, shape ``[B, 5]``) of padded ``[B, T]`` log-probs;
    ``mask`` marks the real tokens (rows without any are left out)."""
    mask = mask.to(torch.bool)
    d = (train_logp.double() - engine_logp.double()).masked_fill(~mask, 0.0)
    k3 = (torch.exp(d) - d - 1.0).masked_fill(~mask, 0.0)
    out = torch.stack([mask.sum(-1).double(), d.abs().sum(-1), d.abs().amax(-1), k3.sum(-1), d.sum(-1)], dim=-1)
    return out[mask.any(-1)]


def row_summaries_ragged(train_logps: Sequence[Sequence[float] | torch.Tensor],
                         engine_logps: Sequence[Sequence[float] | torch.Tensor]) -> torch.Tensor:
    """:func:`row_summaries` of one 1-D pair per row (pairs must have equal lengths)."""
    rows = [(torch.as_tensor(a, dtype=torch.float64).flatten(), torch.as_tensor(b, dtype=torch.float64).flatten())
            for a, b in zip(train_logps, engine_logps, strict=True)]
    for i, (a, b) in enumerate(rows):
        if len(a) != len(b):
            raise ValueError(f"row {i}: {len(a)} trainer log-probs for {len(b)} engine log-probs")
    if not rows:
        return torch.zeros(0, 5, dtype=torch.float64)
    width = max(len(a) for a, _ in rows)
    train = pad_values([a for a, _ in rows], width, torch.float64)
    engine = pad_values([b for _, b in rows], width, torch.float64)
    mask = torch.arange(width)[None, :] < torch.tensor([len(a) for a, _ in rows])[:, None]
    return row_summaries(train, engine, mask)


def summarize(rows: torch.Tensor | Sequence[Sequence[float]]) -> dict[str, float]:
    """The figures of the module docstring from row summaries (``{}`` when there are none)."""
    rows = torch.as_tensor(rows, dtype=torch.float64).reshape(-1, 5)
    if not len(rows) or rows[:, 0].sum() <= 0:
        return {}
    tokens = rows[:, 0].sum()
    seq = rows[:, 4] / rows[:, 0]
    return {
        "mean_abs": float(rows[:, 1].sum() / tokens),
        "max_abs": float(rows[:, 2].max()),
        "k3_kl": float(rows[:, 3].sum() / tokens),
        "seq_log_ratio_mean": float(seq.mean()),
        "seq_log_ratio_std": float(seq.std(unbiased=False)),
        "ppl_ratio": math.exp(-float(rows[:, 4].sum() / tokens)),
    }
