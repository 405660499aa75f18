"""The one packing of (prompt, response) token rows for a causal-LM forward, and per-token values padded alike.

Scoring (old log-probs), the reference pass and the policy update all pack rows with :func:`pack_rows`, so a row's
log-probs line up with the same columns everywhere; :func:`pad_values` pads per-token values (old or reference
log-probs) to the response columns of such a pack.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["pack_rows", "pad_values"]


def pack_rows(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int,
              ) -> dict[str, torch.Tensor]:
    """Pack B rows (P = longest prompt, R = longest response): prompts **left**-padded into columns ``[0, P)``,
    responses **right**-padded into ``[P, P + R)``, so every response starts at column P.

    Returns ``input_ids`` [B, P+R] (pads = ``pad_id``), ``attention_mask`` [B, P+R] (long), ``position_ids``
    [B, P+R] (count of real tokens before each position: left padding shifts positions), ``response_ids`` [B, R]
    = ``input_ids[:, P:]`` (the labels) and ``response_mask`` [B, R] float32, 1 on real response tokens. The logits
    that predict the responses are ``logits[:, P-1 : P+R-1]``.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("pack_rows: no rows to pack")
    b = len(prompt_ids)
    p = max(len(x) for x in prompt_ids)
    r = max(len(x) for x in response_ids)
    input_ids = torch.full((b, p + r), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((b, p + r), dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        lp, lr = len(prompt), len(response)
        input_ids[i, p - lp : p] = torch.as_tensor(prompt, dtype=torch.long)
        input_ids[i, p : p + lr] = torch.as_tensor(response, dtype=torch.long)
        attention_mask[i, p - lp : p + lr] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_ids": input_ids[:, p:].clone(),
        "response_mask": attention_mask[:, p:].to(torch.float32),
    }


def pad_values(rows: Sequence[Any], width: int, dtype: Any = torch.float32) -> torch.Tensor:
    """Per-token values of B rows (1-D tensors or sequences of floats) as [B, width], right-padded with 0; a
    ``None`` row is all 0."""
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, values in enumerate(rows):
        if values is not None and len(values):
            out[i, : len(values)] = torch.as_tensor(values[:width], dtype=dtype)
    return out
