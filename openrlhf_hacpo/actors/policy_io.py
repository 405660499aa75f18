"""A policy rank's weights going out and its training state saved and restored.

* Export: the full state dict by HF name (:meth:`PolicyIO.state_dict_for_sync`), the weight sync to the agent's
  vLLM engines (object store, NCCL broadcast or CUDA IPC) and ``from_pretrained``-loadable checkpoints
  (:meth:`PolicyIO.save_hf`). Under ZeRO-3 every rank takes part: tensors are gathered bucket by bucket
  (:mod:`openrlhf_hacpo.actors.weight_export`). A LoRA agent exports its merged weights under the base model's
  names on every path (:mod:`openrlhf_hacpo.actors.lora`), so the engines sample the trained adapter.
* Training state: DeepSpeed's checkpoint (weights, optimizer, scheduler) plus the caller's counters and every RNG.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from openrlhf_hacpo.config import AgentConfig
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.utils.safe_load import checkpoint_io, load_torch_file

__all__ = ["CHECKPOINT_TAG", "PolicyIO"]

CHECKPOINT_TAG = "state"


class PolicyIO:
    """Weight export and training-state I/O of one data-parallel rank (``rank`` of ``world_size``) of ``agent``.

    Args:
        agent: the agent's configuration.
        engine: the rank's DeepSpeed engine (``engine.module`` is the HF model).
        tokenizer: saved next to exported models.
        rank / world_size: this rank within the agent.
        device: the rank's device.
    """

    def __init__(self, agent: AgentConfig, engine: Any, tokenizer: Any, rank: int, world_size: int,
                 device: torch.device) -> None:
        self.agent, self.engine, self.tokenizer = agent, engine, tokenizer
        self.model = engine.module
        self.rank, self.world_size, self.device = rank, world_size, device
        self._engine_group: Any = None

    weight_bucket_bytes: int = 512 * 2**20
    """Full-tensor bytes gathered at once under ZeRO-3 when weights are exported (sync, ``save_hf``)."""

    def _weight_buckets(self):
        """The model's state-dict tensors in buckets, gathered one bucket at a time under ZeRO-3 (all ranks iterate;
        see :mod:`openrlhf_hacpo.actors.weight_export`)."""
        from openrlhf_hacpo.actors.weight_export import gathered_buckets

        return gathered_buckets(self.model, zero3=self.agent.zero_stage == 3, bucket_bytes=self.weight_bucket_bytes)

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """The full state dict by HF name, on CPU (gathered bucket by bucket under ZeRO-3): what the engines receive.

        Tied weights appear under every name (e.g. ``lm_head.weight`` next to ``model.embed_tokens.weight``), as one
        CPU tensor: vLLM keeps its own copy of a tied output projection.
        """
        state: dict[str, torch.Tensor] = {}
        for bucket in self._weight_buckets():
            for entry in bucket:
                copy = entry.tensor.detach().to("cpu", copy=True)
                state.update((name, copy) for name in entry.names)
        return state

    def init_engine_weight_sync(self, engines: Sequence[Any]) -> None:
        """Build the broadcast group between this rank (rank 0 of the agent) and every worker of ``engines``."""
        from openrlhf_hacpo.engines.weight_sync import init_engine_weight_sync

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self._engine_group = init_engine_weight_sync(
            engines, self.agent.vllm_tensor_parallel_size, backend,
            group_name=f"hacpo_sync_{self.agent.name}")

    def sync_weights_to_engines(self, engines: Sequence[Any], mode: str = "object_store") -> int:
        """Send the current weights to the agent's vLLM engines (all ranks call it; only rank 0 sends).

        ``mode="object_store"`` puts one CPU copy into Ray's object store for every engine to load;
        ``"broadcast"`` streams each tensor over the group made by :meth:`init_engine_weight_sync`, announcing the
        names, dtypes and full shapes first, so under ZeRO-3 each bucket is gathered, sent and released in turn;
        ``"cuda_ipc"`` (engines colocated on this agent's GPUs) hands the engines CUDA IPC handles of each bucket
        from every rank's GPU, so each engine worker maps the copy on its own GPU (no host copy).
        Tied weights are sent under every name (vLLM keeps its own copy of a tied output projection). Returns the
        number of named tensors sent (0 on the other ranks).

        Memory, as OpenRLHF orders it: every rank first empties PyTorch's CUDA cache (blocks the update freed, which
        a colocated engine's weights need), then rank 0 wakes only the engines' *weights* (sleeping engines; the
        KV cache wakes just before the next generation), the weights are copied, and the cache is emptied again.
        """
        from openrlhf_hacpo.engines.weight_sync import wake_engine_weights

        if mode not in ("object_store", "broadcast", "cuda_ipc"):
            raise ValueError(f"weight sync mode must be 'object_store', 'broadcast' or 'cuda_ipc', got {mode!r}")
        self._release_cached_memory()
        if self.world_size > 1:
            torch.distributed.barrier()  # every rank's cache is free before any engine memory comes back
        if self.rank == 0:
            wake_engine_weights(engines)
        try:
            return self._send_weights(engines, mode)
        finally:
            self._release_cached_memory()

    def _release_cached_memory(self) -> None:
        """Hand the CUDA blocks PyTorch caches but no tensor uses back to the driver (a no-op off CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _send_weights(self, engines: Sequence[Any], mode: str) -> int:
        from openrlhf_hacpo.engines.weight_sync import (
            broadcast_weights_to_engines,
            dtype_name,
            push_weights_to_engines,
        )

        if mode == "cuda_ipc":
            return self._sync_weights_cuda_ipc(engines)
        if mode == "object_store":
            named: list[tuple[str, torch.Tensor]] = []
            for bucket in self._weight_buckets():
                if self.rank == 0:
                    for entry in bucket:
                        copy = entry.tensor.detach().to("cpu", copy=True)
                        named.extend((name, copy) for name in entry.names)
            if self.rank == 0:
                push_weights_to_engines(engines, named)
            return len(named)
        stream = ((name, entry.tensor.detach()) for bucket in self._weight_buckets() for entry in bucket
                  for name in entry.names)
        if self.rank != 0:
            for _ in stream:  # take part in the ZeRO-3 gathers
                pass
            return 0
        from openrlhf_hacpo.actors.weight_export import export_entries

        specs = [(name, dtype_name(entry.tensor.dtype), list(entry.full_shape))
                 for entry in export_entries(self.model) for name in entry.names]
        broadcast_weights_to_engines(engines, stream, self._engine_group, specs=specs)
        return len(specs)

    def _sync_weights_cuda_ipc(self, engines: Sequence[Any]) -> int:
        """Per bucket: every rank makes IPC handles of its (gathered) tensors, rank 0 collects them by GPU and has
        every engine load them, then all ranks move on together (the bucket's memory must outlive the loads)."""
        import ray

        from openrlhf_hacpo.engines.weight_sync import cuda_ipc_payload, gpu_uuid

        sent = 0
        for bucket in self._weight_buckets():
            named = [(name, entry.tensor) for entry in bucket for name in entry.names]
            payload, keep = cuda_ipc_payload(named)
            by_gpu = {gpu_uuid(self.device): payload}
            if self.world_size > 1:
                gathered: list[Any] = [None] * self.world_size
                torch.distributed.all_gather_object(gathered, by_gpu)
                by_gpu = {uuid: data for part in gathered for uuid, data in part.items()}
            if self.rank == 0:
                ray.get([engine.update_weights_ipc.remote(by_gpu) for engine in engines])
                sent += len(named)
            if self.world_size > 1:
                torch.distributed.barrier()
            del keep
        return sent

    def save_hf(self, path: str, dtype: str = "auto") -> str | None:
        """Write a ``from_pretrained``-loadable checkpoint (model, tokenizer, generation config) atomically.

        ``dtype="auto"`` stores the floating tensors in the dtype of the agent's pretrained checkpoint (its config's
        ``dtype``; the training dtype when the config names none), so a bf16 model trained in fp32 comes back in
        bf16; ``"float32"``, ``"bfloat16"`` or ``"float16"`` choose one. Tied weights are stored once, as
        ``save_pretrained`` does for the model itself. A LoRA agent writes its merged weights under the base model's
        names (plain ``from_pretrained`` loads them) and its adapter in ``adapter/`` (``PeftModel.from_pretrained``
        on the pretrained model loads it). Every rank must call it (ZeRO-3 gathers bucket by bucket); rank 0 writes.
        Returns the path on rank 0.
        """
        import json

        from openrlhf_hacpo.actors.lora import adapter_state_dict, base_model, is_lora_model
        from openrlhf_hacpo.utils.atomic import atomic_dir

        target = self._hf_save_dtype(dtype)
        state: dict[str, torch.Tensor] = {}
        for bucket in self._weight_buckets():
            if self.rank != 0:
                continue
            for entry in bucket:
                tensor = entry.tensor.detach()
                cast = target if tensor.is_floating_point() else tensor.dtype
                copy = tensor.to("cpu", dtype=cast, copy=True)
                state.update((name, copy) for name in entry.names)  # one tensor: the tie survives the save
        lora = is_lora_model(self.model)
        adapter = adapter_state_dict(self.model, zero3=self.agent.zero_stage == 3) if lora else {}
        if self.rank != 0:
            return None
        with atomic_dir(path) as tmp:
            base_model(self.model).save_pretrained(tmp, state_dict=state, safe_serialization=True)
            if lora:
                self.model.save_pretrained(os.path.join(tmp, "adapter"), state_dict=adapter,
                                           safe_serialization=True, save_embedding_layers=False)
            self.tokenizer.save_pretrained(tmp)
            # save_pretrained names the training dtype; config.json must name the stored one
            config_file = Path(tmp) / "config.json"
            config = json.loads(config_file.read_text(encoding="utf-8"))
            config["dtype"] = str(target).removeprefix("torch.")
            config.pop("torch_dtype", None)
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return str(path)

    def _hf_save_dtype(self, dtype: str) -> torch.dtype:
        choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype in choices:
            return choices[dtype]
        if dtype != "auto":
            raise ValueError(f"agent {self.agent.name!r}: save_hf dtype must be 'auto' or one of {sorted(choices)}, "
                             f"got {dtype!r}")
        from transformers import AutoConfig

        from openrlhf_hacpo.actors.weight_export import checkpoint_dtype

        original = checkpoint_dtype(AutoConfig.from_pretrained(self.agent.pretrain))
        return original or next(p.dtype for p in self.model.parameters() if p.is_floating_point())


    # ------------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, counters: dict[str, int]) -> dict[str, Any]:
        """Save weights, optimizer, scheduler, ``counters`` and RNG states under ``path`` (all ranks call it).

        Returns the files this rank wrote with their sizes on its node
        (:func:`~openrlhf_hacpo.actors.checkpoint_files.rank_manifest`), for the driver to verify."""
        from openrlhf_hacpo.actors.checkpoint_files import deepspeed_rank_files, rank_manifest

        rng_file = os.path.join(path, f"rng_rank{self.rank}.pt")
        with checkpoint_io(f"agent {self.agent.name!r}", path, "save"):
            self.engine.save_checkpoint(path, tag=CHECKPOINT_TAG, client_state=dict(counters), save_latest=False)
            torch.save(capture_rng_state(), rng_file)
        return rank_manifest(self.rank, path, [*deepspeed_rank_files(self.engine, path, CHECKPOINT_TAG), rng_file])

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote (RNG states included); returns the saved counters."""
        if not os.path.isdir(os.path.join(path, CHECKPOINT_TAG)):
            raise FileNotFoundError(f"agent {self.agent.name!r}: no checkpoint under {path}")
        with checkpoint_io(f"agent {self.agent.name!r}", path, "load"):
            load_path, client_state = self.engine.load_checkpoint(
                path, tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True)
        if load_path is None:
            raise RuntimeError(f"agent {self.agent.name!r}: DeepSpeed could not load the checkpoint under {path}")
        rng_file = os.path.join(path, f"rng_rank{self.rank}.pt")
        if os.path.isfile(rng_file):
            restore_rng_state(load_torch_file(rng_file, f"agent {self.agent.name!r}"))
        return dict(client_state or {})
