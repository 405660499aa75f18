"""The one packing of (prompt, response) token rows for a causal-LM forward, per-token values padded alike, and
micro-batches of rows of similar length.

Scoring (old log-probs), the reference pass and the policy update all pack rows with :func:`pack_rows`, so a row's
log-probs line up with the same columns everywhere; :func:`pad_values` pads per-token values (old or reference
log-probs) to the response columns of such a pack.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import torch

__all__ = ["PackedRows", "micro_batch_groups", "pack_rows", "packed_positions", "pad_values", "length_grouped"]


@dataclass(frozen=True)
class PackedRows:
    """B rows packed for one causal-LM forward (P = longest prompt, R = longest response).

    * ``input_ids`` [B, P+R] long: prompts left-padded into ``[0, P)``, responses right-padded into ``[P, P+R)``;
    * ``attention_mask`` [B, P+R] long; ``position_ids`` [B, P+R] (real tokens before each position);
    * ``response_ids`` [B, R] = ``input_ids[:, P:]`` (the labels); ``response_mask`` [B, R] float32, 1 on real
      response tokens.

    The logits that predict the responses are ``logits[:, P-1 : P+R-1]``. Fields are read as attributes or, by the
    model code, by name (``packed["input_ids"]``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    def __getitem__(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def to(self, device: Any) -> "PackedRows":
        return PackedRows(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def padding_fraction(self) -> float:
        """Share of the computed positions ``B·(P+R)`` that are padding."""
        return 1.0 - float(self.attention_mask.sum()) / max(self.attention_mask.numel(), 1)


def pack_rows(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], pad_id: int,
              ) -> PackedRows:
    """Pack B rows into a :class:`PackedRows` (prompts **left**-padded, responses **right**-padded, so every
    response starts at column P)."""
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
    return PackedRows(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        response_ids=input_ids[:, p:].clone(),
        response_mask=attention_mask[:, p:].to(torch.float32),
    )


def length_grouped(prompt_lengths: Sequence[int], response_lengths: Sequence[int], max_rows: int,
                   max_tokens: int | None = None) -> list[list[int]]:
    """Row indices in groups (micro-batches) of rows of similar length, so packing them pads little.

    Rows are ordered by (response length, prompt length) and cut into consecutive groups of at most ``max_rows``
    rows and, with ``max_tokens``, at most ``max_tokens`` packed positions (rows × (longest prompt + longest
    response) of the group; a single longer row still forms its own group). Each group lists its rows in their
    original order. The number of groups is ``ceil(B / max_rows)`` without a token budget.
    """
    if len(prompt_lengths) != len(response_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompt lengths for {len(response_lengths)} response lengths")
    if not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"length_grouped: max_rows must be a positive int, got {max_rows!r}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"length_grouped: max_tokens must be a positive int or None, got {max_tokens!r}")
    order = sorted(range(len(prompt_lengths)), key=lambda i: (response_lengths[i], prompt_lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    longest_p = longest_r = 0
    for i in order:
        p, r = max(longest_p, prompt_lengths[i]), max(longest_r, response_lengths[i])
        full = len(current) >= max_rows or (max_tokens is not None and current and (len(current) + 1) * (p + r)
                                            > max_tokens)
        if full:
            groups.append(sorted(current))
            current, p, r = [], prompt_lengths[i], response_lengths[i]
        current.append(i)
        longest_p, longest_r = p, r
    if current:
        groups.append(sorted(current))
    return groups


def micro_batch_groups(prompt_lengths: Sequence[int], response_lengths: Sequence[int], max_rows: int,
                       group_by_length: bool, max_tokens: int | None = None) -> list[list[int]]:
    """Row indices cut into micro-batches of at most ``max_rows`` rows: grouped by length (:func:`length_grouped`,
    also when a ``max_tokens`` budget is given) or consecutive in the given order."""
    if group_by_length or max_tokens is not None:
        return length_grouped(prompt_lengths, response_lengths, max_rows, max_tokens)
    return [list(range(s, min(s + max_rows, len(prompt_lengths)))) for s in range(0, len(prompt_lengths), max_rows)]


def packed_positions(prompt_lengths: Sequence[int], response_lengths: Sequence[int],
                     groups: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(token positions computed, real tokens) when each group is packed by :func:`pack_rows`: a group of B rows
    takes B × (longest prompt + longest response) positions, of which ``Σ (prompt + response)`` are real."""
    positions = real = 0
    for group in groups:
        if group:
            positions += len(group) * (max(prompt_lengths[i] for i in group) + max(response_lengths[i] for i in group))
            real += sum(prompt_lengths[i] + response_lengths[i] for i in group)
    return positions, real


def pad_values(rows: Sequence[Any], width: int, dtype: Any = torch.float32) -> torch.Tensor:
    """Per-token values of B rows (1-D tensors or sequences of floats) as [B, width], right-padded with 0; a
    ``None`` row is all 0."""
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, values in enumerate(rows):
        if values is not None and len(values):
            out[i, : len(values)] = torch.as_tensor(values[:width], dtype=dtype)
    return out
