"""Weight-sync plumbing without vLLM: tensor encoding, the standalone gloo broadcast group, and the worker extension
(mixed into a stand-in worker that records what it is asked to load)."""
from __future__ import annotations

import threading

import pytest
import torch

from openrlhf_hacpo.engines.weight_sync import (
    broadcast_weights_to_engines,
    VLLMWorkerWeightSync,
    create_weight_sync_group,
    dtype_from_name,
    pack_named_tensors,
    receive_broadcast_tensors,
    reload_api,
    tensor_specs,
    unpack_named_tensors,
)
from openrlhf_hacpo.utils.network import free_port


def _sample_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "w32": torch.randn(3, 4, generator=generator),
        "wbf16": torch.randn(5, generator=generator).to(torch.bfloat16),
        "w16": torch.randn(2, 2, generator=generator).half(),
        "ids": torch.tensor([[1, -2], [3, 4]], dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # non-contiguous
    }


def test_pack_unpack_round_trip_is_exact():
    tensors = _sample_tensors()
    restored = dict(unpack_named_tensors(pack_named_tensors(tensors)))
    assert list(restored) == list(tensors)
    for name, tensor in tensors.items():
        assert restored[name].dtype == tensor.dtype and restored[name].shape == tensor.shape
        assert torch.equal(restored[name], tensor), name
    # Packed items are plain Python values (str, list, bytes): forwardable by any RPC layer.
    for name, dtype, shape, data in pack_named_tensors(tensors):
        assert isinstance(name, str) and isinstance(dtype, str) and isinstance(shape, list) and isinstance(data, bytes)


def test_dtype_names():
    assert dtype_from_name("bfloat16") is torch.bfloat16
    assert dtype_from_name("torch.float32") is torch.float32
    with pytest.raises(ValueError, match="no_dtype"):
        dtype_from_name("no_dtype")


def _run_ranks(*targets):
    """Run each rank's function in its own thread; re-raise the first failure."""
    errors = []

    def wrap(target):
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=wrap, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]


def test_gloo_group_broadcasts_tensors_in_spec_order():
    tensors = {k: v.contiguous() for k, v in _sample_tensors().items() if v.numel() > 0}
    port = free_port()
    received: dict[str, torch.Tensor] = {}

    def sender():
        group = create_weight_sync_group("127.0.0.1", port, 0, 2, "test_group", backend="gloo", timeout_s=30)
        for tensor in tensors.values():
            group.broadcast(tensor)

    def receiver():
        group = create_weight_sync_group("127.0.0.1", port, 1, 2, "test_group", backend="gloo", timeout_s=30)
        specs = tensor_specs(tensors.items())
        received.update(receive_broadcast_tensors(group, specs, torch.device("cpu")))

    _run_ranks(sender, receiver)
    assert set(received) == set(tensors)
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_group_rejects_bad_rank_and_backend():
    with pytest.raises(ValueError, match="rank 2"):
        create_weight_sync_group("127.0.0.1", 1, 2, 2, "g", backend="gloo")
    with pytest.raises(ValueError, match="'mpi'"):
        create_weight_sync_group("127.0.0.1", free_port(), 0, 1, "g", backend="mpi", timeout_s=5)


class _RunnerWithInplaceReload:
    """vLLM >= 0.16's model runner: `reload_weights(weights_iterator=..., is_checkpoint_format=...)`."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format: bool = True):
        assert is_checkpoint_format and weights_path is None
        for name, tensor in weights_iterator:
            self.loaded[name] = tensor.clone()


class _OldModel:
    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
        return set(self.loaded)


class _RunnerWithDiskReload:
    """vLLM < 0.16's model runner: `reload_weights()` takes no arguments and re-reads the checkpoint from disk."""

    def __init__(self):
        self.model = _OldModel()
        self.loaded = self.model.loaded

    def reload_weights(self) -> None:
        raise AssertionError("the disk reload must not be used for in-memory weights")


class _StandInWorker(VLLMWorkerWeightSync):
    """What the extension needs from a vLLM worker: rank, device and a model runner."""

    def __init__(self, rank: int, runner=None):
        self.rank = rank
        self.device = torch.device("cpu")
        self.model_runner = runner if runner is not None else _RunnerWithInplaceReload()

    @property
    def loaded(self) -> dict[str, torch.Tensor]:
        return self.model_runner.loaded


def test_reload_api_is_read_from_the_runner_signature():
    assert reload_api(_RunnerWithInplaceReload()) == "reload_weights"
    assert reload_api(_RunnerWithDiskReload()) == "load_weights"
    assert reload_api(object()) == "load_weights"


@pytest.mark.parametrize("runner_class", [_RunnerWithInplaceReload, _RunnerWithDiskReload])
def test_worker_extension_loads_through_either_vllm_api(runner_class):
    tensors = _sample_tensors()
    worker = _StandInWorker(rank=0, runner=runner_class())
    assert worker.load_named_tensors(pack_named_tensors(tensors)) == len(tensors)
    assert set(worker.loaded) == set(tensors)
    assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in tensors.items())


def test_worker_extension_object_store_path():
    tensors = _sample_tensors()
    worker = _StandInWorker(rank=0)
    assert worker.load_named_tensors(pack_named_tensors(tensors)) == len(tensors)
    assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in tensors.items())


def test_worker_extension_broadcast_path_two_workers():
    """Rank 0 sends; two workers of one tensor-parallel engine join at rank_offset=1 and load every tensor."""
    tensors = {"a": torch.randn(4, 3), "b": torch.arange(6, dtype=torch.int32)}
    port = free_port()
    workers = [_StandInWorker(rank=0), _StandInWorker(rank=1)]
    specs = tensor_specs(tensors.items())

    def sender():
        group = create_weight_sync_group("127.0.0.1", port, 0, 3, "hacpo", backend="gloo", timeout_s=30)
        for tensor in tensors.values():
            group.broadcast(tensor)

    def worker_side(worker):
        def run():
            assert worker.init_weight_sync_group("127.0.0.1", port, 1, 3, "hacpo", "gloo", 30) == 1 + worker.rank
            assert worker.receive_broadcast_weights(specs) == len(tensors)

        return run

    _run_ranks(sender, *(worker_side(w) for w in workers))
    for worker in workers:
        assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in tensors.items())


def test_worker_extension_requires_the_group_before_receiving():
    with pytest.raises(RuntimeError, match="init_weight_sync_group"):
        _StandInWorker(rank=0).receive_broadcast_weights([("a", "float32", [1])])


class _FakeRemoteMethod:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class _RecordingGroup:
    def __init__(self):
        self.sent: list[torch.Tensor] = []

    def broadcast(self, tensor):
        self.sent.append(tensor.clone())


class _FakeEngine:
    def __init__(self):
        self.announced = None
        self.receive_broadcast_weights = _FakeRemoteMethod(self._receive)

    def _receive(self, specs):
        self.announced = specs
        return specs


def test_broadcast_streams_a_lazy_iterator_against_announced_specs(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, **kw: refs)
    tensors = {"a": torch.randn(2, 3), "b": torch.arange(4, dtype=torch.int32)}
    specs = tensor_specs(tensors.items())
    engines, group = [_FakeEngine(), _FakeEngine()], _RecordingGroup()
    broadcast_weights_to_engines(engines, iter(tensors.items()), group, specs=specs)
    assert all(engine.announced == [tuple(s) for s in specs] for engine in engines)
    assert [torch.equal(a, b) for a, b in zip(group.sent, tensors.values())] == [True, True]

    with pytest.raises(RuntimeError, match="tensor 1 is"):
        broadcast_weights_to_engines(engines, iter([("a", tensors["a"]), ("b", tensors["a"])]), _RecordingGroup(),
                                     specs=specs)
    with pytest.raises(RuntimeError, match="1 tensors sent, 2 announced"):
        broadcast_weights_to_engines(engines, iter([("a", tensors["a"])]), _RecordingGroup(), specs=specs)


def test_cuda_ipc_worker_loads_the_handles_made_on_its_own_gpu(monkeypatch):
    """The IPC protocol with the CUDA specifics replaced: handles are looked up by the worker's GPU identity, mapped
    and loaded with the model's load_weights; handles for other GPUs are ignored."""
    import pickle

    from openrlhf_hacpo.engines import weight_sync

    mine = {"a": torch.randn(2, 2), "b": torch.arange(3.0)}
    other = {"a": torch.zeros(2, 2), "b": torch.zeros(3)}
    monkeypatch.setattr(weight_sync, "gpu_uuid", lambda device: "GPU-mine")
    monkeypatch.setattr(weight_sync, "rebuild_ipc_tensor", lambda handle, index: handle)  # "handle" = the tensor
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    payload = {"GPU-mine": pickle.dumps(list(mine.items())), "GPU-other": pickle.dumps(list(other.items()))}
    worker = _StandInWorker(rank=0, runner=_RunnerWithDiskReload())
    worker.device = torch.device("cpu")
    assert worker.load_ipc_tensors(payload) == 2
    assert all(torch.equal(worker.loaded[n], t) for n, t in mine.items())

    with pytest.raises(RuntimeError, match=r"no handles for this worker's GPU GPU-mine.*\['GPU-other'\]"):
        worker.load_ipc_tensors({"GPU-other": payload["GPU-other"]})
