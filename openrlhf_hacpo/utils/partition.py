"""Contiguous, balanced partitions: the one helper behind data-parallel shares, mini-batches and engine shards."""
from __future__ import annotations

__all__ = ["split_evenly"]


def split_evenly(count: int, parts: int) -> list[range]:
    """``count`` items in ``parts`` contiguous ranges whose sizes differ by at most one (the first ones larger)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
