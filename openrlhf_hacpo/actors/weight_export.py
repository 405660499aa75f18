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

import torch

from openrlhf_hacpo.actors.lora import is_lora_model, merged_entries
from openrlhf_hacpo.actors.weight_entry import LowRankDelta, WeightEntry, full_shape, weight_entries

__all__ = ["LowRankDelta", "WeightEntry", "bucketed", "checkpoint_dtype", "export_entries", "full_shape",
           "gathered_buckets", "weight_entries"]

def export_entries(model: torch.nn.Module) -> list[WeightEntry]:
    """What a policy exports (engines, ``save_hf``): the model's own state dict, or for a LoRA agent the base
    model's state dict with the adapter's updates to merge (:func:`openrlhf_hacpo.actors.lora.merged_entries`)."""
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
