"""Moving a policy's updated weights into its running vLLM engines.

Two paths, both ending in vLLM's in-place weight reload inside every engine worker:

* **Object store** (CPU, or any small model): the policy hands `{name: tensor}` to each engine actor through Ray's
  object store; the engine passes them, byte-encoded, to its workers with `LLM.collective_rpc`.
* **Collective broadcast** (GPU): a process group joins the policy's rank 0 (group rank 0) and every engine worker
  (ranks 1..). Per sync the policy sends the list of (name, dtype, shape) to the engines, then broadcasts each tensor;
  the workers receive the tensors as the reload consumes them. The group is a standalone NCCL (GPU) or gloo (CPU)
  backend built on its own TCP store, so it coexists with the policy's training group and with vLLM's own groups.

`VLLMWorkerWeightSync` is the worker side; vLLM mixes it into its worker class through `worker_extension_cls`.
"""
from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from openrlhf_hacpo.engines.base import NamedTensors, iter_named_tensors

# (name, dtype name, shape) of one broadcast tensor, in broadcast order.
TensorSpec = tuple[str, str, list[int]]
# (name, dtype name, shape, raw bytes) of one tensor sent through an RPC.
PackedTensor = tuple[str, str, list[int], bytes]

WORKER_EXTENSION = "openrlhf_hacpo.engines.weight_sync.VLLMWorkerWeightSync"


# ---------------------------------------------------------------------------------------------- tensor encoding


def dtype_from_name(name: str) -> torch.dtype:
    """`"float32"` or `"torch.float32"` -> `torch.float32`."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack_named_tensors(named_tensors: NamedTensors) -> list[PackedTensor]:
    """Encode tensors as plain (name, dtype, shape, bytes) tuples.

    vLLM's RPC path decodes tensor arguments into views of its receive buffer, which cannot be forwarded to a worker
    process; bytes can. Works for every dtype (bfloat16 included) and for 0-d tensors.
    """
    packed = []
    for name, tensor in iter_named_tensors(named_tensors):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        packed.append((name, dtype_name(tensor.dtype), list(tensor.shape), flat.view(torch.uint8).numpy().tobytes()))
    return packed


def unpack_named_tensors(packed: Iterable[PackedTensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Inverse of `pack_named_tensors` (each tensor owns a fresh copy of its bytes)."""
    for name, dtype, shape, data in packed:
        torch_dtype = dtype_from_name(dtype)
        if len(data) == 0:
            yield name, torch.empty(shape, dtype=torch_dtype)
            continue
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        yield name, raw.view(torch_dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------- broadcast group


def create_weight_sync_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
    timeout_s: float = 600.0,
) -> dist.ProcessGroup:
    """A process group of its own (not registered with `torch.distributed`'s default world).

    Rank 0 hosts the TCP store at (master_address, master_port); the other ranks connect to it. Collectives are the
    backend's methods, e.g. `group.broadcast(tensor, 0).wait()`. `backend` is "nccl" (CUDA tensors) or "gloo" (CPU).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"weight-sync rank {rank} is outside the world of size {world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, master_port, world_size, is_master=(rank == 0), timeout=timeout)
    store = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("weight-sync backend 'nccl' requested, but this torch build has no NCCL")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"weight-sync backend must be 'nccl' or 'gloo', got {backend!r}")


def tensor_specs(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [(name, dtype_name(tensor.dtype), list(tensor.shape)) for name, tensor in named_tensors]


def receive_broadcast_tensors(
    group: dist.ProcessGroup, specs: Sequence[TensorSpec], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive, lazily and in order, the tensors rank 0 broadcasts for `specs` (one at a time in memory)."""
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype_from_name(dtype), device=device)
        group.broadcast(tensor, 0).wait()
        yield name, tensor


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------- vLLM worker side


class VLLMWorkerWeightSync:
    """Methods vLLM adds to each of its workers (`worker_extension_cls=WORKER_EXTENSION`), called through
    `LLM.collective_rpc(method_name, args=...)`. `self` is the vLLM worker: `self.rank`, `self.device`,
    `self.model_runner` come from it.
    """

    def load_named_tensors(self, packed: list[PackedTensor]) -> int:
        """Object-store path: load byte-encoded HF-named tensors. Returns how many tensors were given."""
        self._reload_named_tensors(unpack_named_tensors(packed))
        return len(packed)

    def init_weight_sync_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float = 600.0,
    ) -> int:
        """Join the broadcast group as rank `rank_offset + worker rank`. Returns that group rank."""
        group_rank = rank_offset + self.rank
        self._weight_sync_group = create_weight_sync_group(
            master_address, master_port, group_rank, world_size, group_name, backend, timeout_s
        )
        return group_rank

    def receive_broadcast_weights(self, specs: list[TensorSpec]) -> int:
        """Broadcast path: receive every tensor of `specs` from group rank 0 and load it. Returns the count."""
        group = getattr(self, "_weight_sync_group", None)
        if group is None:
            raise RuntimeError("receive_broadcast_weights called before init_weight_sync_group")
        self._reload_named_tensors(receive_broadcast_tensors(group, specs, self.device))
        return len(specs)

    def close_weight_sync_group(self) -> None:
        self._weight_sync_group = None

    def _reload_named_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # vLLM >= 0.12 re-runs each layer's post-load processing (e.g. the CPU backend's packed GEMM weights);
        # older versions keep plain parameters that `load_weights` can overwrite directly.
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=named_tensors)


# ---------------------------------------------------------------------------------------------- policy side


def push_weights_to_engines(engines: Sequence, named_tensors: NamedTensors) -> None:
    """Object-store path, from any process holding the engine handles: put the tensors into Ray's object store once
    and have every engine load them."""
    import ray

    pairs = [(name, tensor.detach().to("cpu")) for name, tensor in iter_named_tensors(named_tensors)]
    ref = ray.put(pairs)
    ray.get([engine.update_weights.remote(ref) for engine in engines])


def init_engine_weight_sync(
    engines: Sequence,
    tensor_parallel_size: int,
    backend: str,
    group_name: str = "hacpo_weight_sync",
    master_address: str | None = None,
    master_port: int | None = None,
    timeout_s: float = 600.0,
) -> dist.ProcessGroup:
    """Broadcast path, called in the process that will send the weights (the policy's rank 0): build the group of
    this process (rank 0) and every worker of every engine (engine i's workers are ranks 1 + i*tp ...)."""
    import ray

    master_address = master_address or ray.util.get_node_ip_address()
    master_port = master_port or find_free_port()
    world_size = 1 + len(engines) * tensor_parallel_size
    refs = [
        engine.init_weight_sync_group.remote(
            master_address, master_port, 1 + index * tensor_parallel_size, world_size, group_name, backend, timeout_s
        )
        for index, engine in enumerate(engines)
    ]
    group = create_weight_sync_group(master_address, master_port, 0, world_size, group_name, backend, timeout_s)
    ray.get(refs)
    return group


def broadcast_weights_to_engines(engines: Sequence, named_tensors: NamedTensors, group: dist.ProcessGroup) -> None:
    """Broadcast path: announce the specs to every engine, then broadcast each tensor from rank 0 in that order.

    Tensors must live on the group's device (CUDA for NCCL, CPU for gloo).
    """
    import ray

    pairs = [(name, tensor.detach().contiguous()) for name, tensor in iter_named_tensors(named_tensors)]
    specs = tensor_specs(pairs)
    refs = [engine.receive_broadcast_weights.remote(specs) for engine in engines]
    for _, tensor in pairs:
        group.broadcast(tensor, 0).wait()
    ray.get(refs)
