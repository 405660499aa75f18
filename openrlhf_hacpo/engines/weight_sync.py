"""Moving a policy's updated weights into its running vLLM engines.

Three paths, each ending in an in-place load inside every engine worker; the trainer picks one from the layout
(`AgentGroup.weight_sync_mode`, table in docs/engines.md, "Weight sync"):

* **Object store** (CPU; colocated GPU engines when some engine GPU holds no policy rank): the policy hands
  `{name: tensor}` to each engine actor through Ray's object store; the engine passes them, byte-encoded, to its
  workers with `LLM.collective_rpc`.
* **CUDA IPC** (GPU engines colocated with the policy, every engine GPU holding a policy rank): the policy hands each
  engine worker CUDA IPC handles of the tensors in its own GPU memory, one bucket at a time; the worker maps them and
  copies them into its model. No host copy is made; the handles (a few hundred bytes per tensor) travel pickled as
  bytes.
* **Collective broadcast** (dedicated GPU engines): a broadcast group joins the policy's rank 0 (group rank 0) and
  every worker of every engine of the agent (ranks 1..). Per sync the policy sends the list of (name, dtype, shape) to
  the engines, then broadcasts each tensor; the workers receive the tensors as the reload consumes them. On GPU the
  group is vLLM's `PyNcclCommunicator` over a `StatelessProcessGroup` (what vLLM's RLHF examples and OpenRLHF use):
  it lives outside `torch.distributed`'s default world, so it coexists with the policy's training group and with
  vLLM's own groups, and it is built the same way by the policy and by every tensor-parallel worker. On CPU the
  same protocol runs on a standalone gloo group (tests only: the trainer uses the object store on CPU).

How a worker loads the object-store and broadcast tensors depends on the vLLM version (`reload_api`): from vLLM 0.16
the model runner's `reload_weights(weights_iterator=..., is_checkpoint_format=True)` reloads in place and re-runs
each layer's post-load processing (e.g. the CPU backend's packed GEMM weights); before that `reload_weights()` takes
no arguments and reads the checkpoint from disk, so the tensors go to `model.load_weights(weights=...)` directly.

`VLLMWorkerWeightSync` is the worker side; vLLM mixes it into its worker class through `worker_extension_cls`.
"""
from __future__ import annotations

import datetime
import inspect
import pickle
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from openrlhf_hacpo.engines.base import NamedTensors, iter_named_tensors
from openrlhf_hacpo.utils.network import listening_store

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


class WeightSyncGroup:
    """A broadcast group whose rank 0 sends: `broadcast(tensor)` sends (rank 0) or fills (other ranks) `tensor` in
    place and returns when the tensor may be read on the caller's device (stream-ordered on CUDA)."""

    def __init__(self, backend: str, communicator) -> None:
        self.backend = backend
        self.communicator = communicator

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.backend == "gloo":
            self.communicator.broadcast(tensor, 0).wait()
        else:
            self.communicator.broadcast(tensor, src=0, stream=torch.cuda.current_stream())


def listen_for_weight_sync(master_address: str, backend: str, world_size: int,
                           timeout_s: float = 600.0) -> tuple[int, Any]:
    """Group rank 0's listener on ``master_address``, bound and listening before its port is announced:
    ``(port, listener)``. ``gloo``: the group's TCP store (:func:`openrlhf_hacpo.utils.network.listening_store`);
    ``nccl``: a socket bound the same way (port 0), for vLLM's ``StatelessProcessGroup.create(listen_socket=...)``.
    Pass it to :func:`create_weight_sync_group` on rank 0."""
    if backend == "gloo":
        store = listening_store(master_address, world_size, datetime.timedelta(seconds=timeout_s))
        return store.port, store
    if backend == "nccl":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((master_address, 0))
        listener.listen()
        return listener.getsockname()[1], listener
    raise ValueError(f"weight-sync backend must be 'nccl' or 'gloo', got {backend!r}")


def create_weight_sync_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
    timeout_s: float = 600.0,
    listener: Any = None,
) -> WeightSyncGroup:
    """A broadcast group of its own (not registered with `torch.distributed`'s default world).

    Rank 0 hosts the TCP store at (master_address, master_port), on its `listener` when given
    (:func:`listen_for_weight_sync`); the other ranks connect to it. `backend` is "nccl" (CUDA tensors on the current
    device; vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`) or "gloo" (CPU tensors; torch's
    `ProcessGroupGloo` on a `TCPStore` prefixed with `group_name`).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"weight-sync rank {rank} is outside the world of size {world_size}")
    if listener is not None and rank != 0:
        raise ValueError(f"only weight-sync rank 0 listens, got a listener on rank {rank}")
    if backend == "gloo":
        timeout = datetime.timedelta(seconds=timeout_s)
        store = listener if listener is not None else dist.TCPStore(master_address, master_port, world_size,
                                                                    is_master=(rank == 0), timeout=timeout)
        store = dist.PrefixStore(group_name, store)
        return WeightSyncGroup("gloo", dist.ProcessGroupGloo(store, rank, world_size, timeout))
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("weight-sync backend 'nccl' needs a CUDA device in this process")
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        process_group = StatelessProcessGroup.create(host=master_address, port=master_port, rank=rank,
                                                     world_size=world_size, store_timeout=int(timeout_s),
                                                     listen_socket=listener)
        return WeightSyncGroup("nccl", PyNcclCommunicator(process_group, device=torch.cuda.current_device()))
    raise ValueError(f"weight-sync backend must be 'nccl' or 'gloo', got {backend!r}")


def tensor_specs(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [(name, dtype_name(tensor.dtype), list(tensor.shape)) for name, tensor in named_tensors]


def receive_broadcast_tensors(
    group: WeightSyncGroup, specs: Sequence[TensorSpec], device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive, lazily and in order, the tensors rank 0 broadcasts for `specs` (one at a time in memory)."""
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype_from_name(dtype), device=device)
        group.broadcast(tensor)
        yield name, tensor


def reload_api(model_runner) -> str:
    """How a worker loads named tensors in place, read from its model runner's actual signature:

    * `"reload_weights"`: `model_runner.reload_weights` takes `weights_iterator` (vLLM >= 0.16);
    * `"load_weights"`: it does not (older vLLM, whose `reload_weights()` re-reads the checkpoint from disk), so the
      tensors go to the model's `load_weights(weights=...)` (OpenRLHF's way).
    """
    reload = getattr(model_runner, "reload_weights", None)
    if reload is not None:
        try:
            parameters = inspect.signature(reload).parameters
        except (TypeError, ValueError):
            parameters = {}
        if "weights_iterator" in parameters:
            return "reload_weights"
    return "load_weights"


def gpu_uuid(device: torch.device | int) -> str:
    """The physical identity of a CUDA device (stable across processes whatever their CUDA_VISIBLE_DEVICES)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def cuda_ipc_payload(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[bytes, list[torch.Tensor]]:
    """Pickled [(name, CUDA IPC handle)] of CUDA tensors, and the tensors the handles point into: the caller keeps
    them alive until every receiver has copied them."""
    from torch.multiprocessing.reductions import reduce_tensor

    keep = []
    handles = []
    for name, tensor in named_tensors:
        tensor = tensor.detach().contiguous()
        keep.append(tensor)
        handles.append((name, reduce_tensor(tensor)))
    return pickle.dumps(handles), keep


def rebuild_ipc_tensor(handle, device_index: int) -> torch.Tensor:
    """Map a CUDA IPC handle (from `reduce_tensor`) in this process, on its device `device_index`."""
    rebuild, args = handle
    args = list(args)
    args[6] = device_index  # rebuild_cuda_tensor's storage_device: the same GPU under this process's numbering
    return rebuild(*args)


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

    def load_ipc_tensors(self, payload_by_gpu: dict[str, bytes]) -> int:
        """CUDA IPC path: map the handles made on this worker's GPU and load the tensors. Returns their count.

        Each bucket is loaded with `model.load_weights` (no layer-wise reload: a bucket holds part of the model, and
        CUDA's unquantized layers need no post-load processing); the copy completes before the sender frees them.
        """
        uuid = gpu_uuid(self.device)
        payload = payload_by_gpu.get(uuid)
        if payload is None:
            raise RuntimeError(f"CUDA IPC weight sync: no handles for this worker's GPU {uuid}; the policy ranks "
                               f"sent handles for {sorted(payload_by_gpu)} (engine and policy must share GPUs)")
        handles = pickle.loads(payload)
        named = [(name, rebuild_ipc_tensor(handle, self.device.index)) for name, handle in handles]
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=named)
        torch.cuda.synchronize(self.device)
        return len(named)

    def _reload_named_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        runner = self.model_runner
        if reload_api(runner) == "reload_weights":
            # the worker's own reload_weights wraps the runner's in vLLM's config context when it has one
            reload = getattr(self, "reload_weights", None) or runner.reload_weights
            reload(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
            return
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=named_tensors)


# ---------------------------------------------------------------------------------------------- policy side


def call_engines(engines: Sequence, method: str, *args, **kwargs) -> list:
    """Call ``method`` on every engine and wait for all: Ray actor handles concurrently, plain objects (an engine in
    this process, or a stand-in) in turn. Returns their results in engine order."""
    bound = [getattr(engine, method) for engine in engines]
    if bound and hasattr(bound[0], "remote"):
        import ray

        return ray.get([call.remote(*args, **kwargs) for call in bound])
    return [call(*args, **kwargs) for call in bound]


def wake_engine_weights(engines: Sequence) -> None:
    """Give sleeping engines back the GPU memory of their weights only (not their KV cache), so a weight sync can
    copy into them; engines that are awake, or have no sleep mode, ignore it, and receivers without a ``wake_up``
    (no sleep mode at all) are left out."""
    sleepers = [engine for engine in engines if hasattr(engine, "wake_up")]
    if sleepers:
        call_engines(sleepers, "wake_up", ["weights"])


def push_weights_to_engines(engines: Sequence, named_tensors: NamedTensors) -> None:
    """Object-store path, from any process holding the engine handles: put the tensors into Ray's object store once
    and have every engine load them (engines in this process get the tensors directly)."""
    pairs = [(name, tensor.detach().to("cpu")) for name, tensor in iter_named_tensors(named_tensors)]
    if engines and hasattr(engines[0].update_weights, "remote"):
        import ray

        ref = ray.put(pairs)
        ray.get([engine.update_weights.remote(ref) for engine in engines])
        return
    call_engines(engines, "update_weights", pairs)


def init_engine_weight_sync(
    engines: Sequence,
    tensor_parallel_size: int,
    backend: str,
    group_name: str = "hacpo_weight_sync",
    master_address: str | None = None,
    master_port: int | None = None,
    timeout_s: float = 600.0,
) -> WeightSyncGroup:
    """Broadcast path, called in the process that will send the weights (the policy's rank 0): build the group of
    this process (rank 0) and every worker of every engine (engine i's workers are ranks 1 + i*tp ...)."""
    import ray

    master_address = master_address or ray.util.get_node_ip_address()
    world_size = 1 + len(engines) * tensor_parallel_size
    listener = None
    if master_port is None:
        master_port, listener = listen_for_weight_sync(master_address, backend, world_size, timeout_s)
    refs = [
        engine.init_weight_sync_group.remote(
            master_address, master_port, 1 + index * tensor_parallel_size, world_size, group_name, backend, timeout_s
        )
        for index, engine in enumerate(engines)
    ]
    group = create_weight_sync_group(master_address, master_port, 0, world_size, group_name, backend, timeout_s,
                                     listener=listener)
    ray.get(refs, timeout=timeout_s)
    return group


def broadcast_weights_to_engines(
    engines: Sequence,
    named_tensors: NamedTensors,
    group: WeightSyncGroup,
    specs: Sequence[TensorSpec] | None = None,
) -> None:
    """Broadcast path: announce the specs to every engine, then broadcast each tensor from rank 0 in that order.

    `named_tensors` may be a lazy iterator (e.g. parameters gathered bucket by bucket under ZeRO-3) when `specs`
    announces its names, dtypes and shapes in advance; otherwise the specs are read from the tensors. Tensors must
    live on the group's device (CUDA for NCCL, CPU for gloo). A tensor that does not match its spec raises before
    it is broadcast.
    """
    import ray

    if specs is None:
        named_tensors = [(name, tensor.detach()) for name, tensor in iter_named_tensors(named_tensors)]
        specs = tensor_specs(named_tensors)
    specs = [tuple(spec) for spec in specs]
    refs = [engine.receive_broadcast_weights.remote(list(specs)) for engine in engines]
    sent = 0
    for name, tensor in iter_named_tensors(named_tensors):
        expected = specs[sent] if sent < len(specs) else None
        actual = (name, dtype_name(tensor.dtype), list(tensor.shape))
        if expected is None or tuple(expected) != actual:
            raise RuntimeError(f"weight broadcast: tensor {sent} is {actual}, the engines were announced {expected}")
        group.broadcast(tensor.detach().contiguous())
        sent += 1
    if sent != len(specs):
        raise RuntimeError(f"weight broadcast: {sent} tensors sent, {len(specs)} announced")
    ray.get(refs)
