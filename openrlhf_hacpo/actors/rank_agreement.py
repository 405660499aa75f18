"""Decisions every data-parallel rank of one agent must take alike (ZeRO-3's gathers are collective, and an update
is skipped on all ranks or on none)."""
from __future__ import annotations

import torch

__all__ = ["agree_on_count", "any_rank"]


def agree_on_count(count: int, world_size: int, device: torch.device) -> int:
    """The largest ``count`` over the agent's ranks (every rank then runs that many passes)."""
    if world_size == 1:
        return count
    value = torch.tensor([float(count)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())


def any_rank(flag: bool, world_size: int, device: torch.device) -> bool:
    """True on every rank of the agent when ``flag`` is True on any."""
    if world_size == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item() > 0)
