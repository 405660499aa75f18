"""Reading a policy's full weights out of its (possibly ZeRO-3 partitioned) model, a bounded bucket at a time.

Every tensor of the Hugging Face state dict is visited once, with all of its names: a tied output projection
(``lm_head.weight`` sharing ``model.embed_tokens.weight``) is one entry with two names, so a checkpoint stores it
once and an engine receives it under both names. Under ZeRO-3 the parameters of one bucket (at most
``bucket_bytes`` of full tensors, or one larger tensor alone) are gathered together and released before the next
bucket, so the peak extra memory per rank is one bucket instead of the whole model. A LoRA agent exports its
merged weights under the base model's names (:mod:`openrlhf_hacpo.actors.lora`), so every engine path and
``save_hf`` receive the trained adapter. The gathers are collective:
every rank of the agent must iterate the buckets to the end, and only rank 0 uses the tensors.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

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


def export_entries(model: torch.nn.Module) -> list[WeightEntry]:
    """What a policy exports (engines, ``save_hf``): the model's own state dict, or for a LoRA agent the base
    model's state dict with the adapter's updates to merge (:func:`openrlhf_hacpo.actors.lora.merged_entries`)."""
    from openrlhf_hacpo.actors.lora import is_lora_model, merged_entries

    return merged_entries(model) if is_lora_model(model) else weight_entries(model)


def bucketed(entries: list[WeightEntry], bucket_bytes: int) -> list[list[WeightEntry]]:
    """Consecutive entries grouped into buckets of at most ``bucket_bytes`` (a larger tensor forms its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[WeightEntry]] = []
    current: list[WeightEntry] = []
    size = 0
    for entry in entries:
        if current and size + entry.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.nbytes
    if current:
        buckets.append(current)
    return buckets


def gathered_buckets(model: torch.nn.Module, zero3: bool, bucket_bytes: int) -> Iterator[list[WeightEntry]]:
    """Yield the buckets of ``model``'s exported weights (:func:`export_entries`), each while its full tensors are
    readable (``entry.tensor``; a LoRA agent's adapted weights already merged into new tensors).

    Under ZeRO-3 each bucket (with the adapter tensors its weights add) is gathered on entry and re-partitioned when
    the iteration moves on; a tensor must be copied if it is needed after that. Every rank must exhaust the
    iterator (the gathers are collective).
    """
    for bucket in bucketed(export_entries(model), bucket_bytes):
        context = contextlib.nullcontext()
        if zero3:
            import deepspeed

            partitioned = [t for entry in bucket for t in entry.tensors() if hasattr(t, "ds_id")]
            context = deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)
        with context:
            yield [entry.merged() for entry in bucket]


def checkpoint_dtype(config) -> torch.dtype | None:
    """The floating dtype a Hugging Face config says its checkpoint is stored in (``dtype`` / ``torch_dtype``)."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None
