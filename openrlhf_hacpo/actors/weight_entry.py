"""The entries of a policy's state dict as they are exported: each tensor once with all of its names (a tied output
projection, ``lm_head.weight`` sharing ``model.embed_tokens.weight``, is one entry with two names), and the low-rank
updates (a LoRA adapter's) its exported value adds. :mod:`.weight_export` reads them out in buckets;
:mod:`.lora` builds a LoRA agent's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["LowRankDelta", "WeightEntry", "full_shape", "weight_entries"]


@dataclass(frozen=True)
class LowRankDelta:
    """A low-rank update ``scale · B A`` added to a weight when it is exported: a LoRA adapter (Hu et al. 2021,
    eq. 3) with ``a`` = A (r × in), ``b`` = B (out × r), ``scale`` = α / r; ``transposed`` when the weight is stored
    (in × out), as GPT-2's ``Conv1D`` stores it."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float
    transposed: bool = False


@dataclass
class WeightEntry:
    """One tensor of the state dict with every name it has there (tied weights: several), and the low-rank updates
    its exported value adds (a LoRA agent's adapted weights; none otherwise)."""

    names: list[str]
    tensor: torch.Tensor
    full_shape: tuple[int, ...] = field(default=())
    deltas: tuple[LowRankDelta, ...] = ()

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.full_shape:
            numel *= size
        return numel * self.tensor.element_size()

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the exported value is computed from (what ZeRO-3 must gather)."""
        return [self.tensor, *(t for delta in self.deltas for t in (delta.a, delta.b))]

    def merged(self) -> "WeightEntry":
        """The entry whose tensor is the exported value ``W + Σ scale · B A`` (itself when it has no update): a new
        tensor in W's dtype, summed in float32; W, A and B are left as they are."""
        if not self.deltas:
            return self
        value = self.tensor.detach().to(torch.float32, copy=True)
        for delta in self.deltas:
            update = delta.b.detach().to(torch.float32) @ delta.a.detach().to(torch.float32)
            value.add_(update.T if delta.transposed else update, alpha=delta.scale)
        return WeightEntry(list(self.names), value.to(self.tensor.dtype), self.full_shape)


def full_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The unpartitioned shape (ZeRO-3 parameters hold a flat local shard and keep the full one in ``ds_shape``)."""
    return tuple(getattr(tensor, "ds_shape", tensor.shape))


def weight_entries(model: torch.nn.Module) -> list[WeightEntry]:
    """The model's state-dict tensors in state-dict order, each once with all its names."""
    by_name: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    by_name.update(model.named_buffers(remove_duplicate=False))
    entries: dict[int, WeightEntry] = {}
    for name in model.state_dict().keys():
        tensor = by_name.get(name)
        if tensor is None:
            raise RuntimeError(f"state-dict entry {name!r} is neither a parameter nor a buffer of the model")
        entry = entries.get(id(tensor))
        if entry is None:
            entries[id(tensor)] = WeightEntry([name], tensor, full_shape(tensor))
        else:
            entry.names.append(name)
    return list(entries.values())
