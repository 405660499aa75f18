"""Weight-sync plumbing without vLLM: tensor encoding, the standalone gloo broadcast group, and the worker extension
(mixed into a stand-in worker that records what it is asked to load)."""
from __future__ import annotations

import errno
import socket
import threading
from types import SimpleNamespace

import pytest
import torch

from openrlhf_hacpo.engines.weight_sync import (
    broadcast_weights_to_engines,
    VLLMWorkerWeightSync,
    create_weight_sync_group,
    dtype_from_name,
    listen_for_weight_sync,
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


@pytest.mark.parametrize("listening", [True, False], ids=["rank0-listens-first", "given-port"])
def test_gloo_group_broadcasts_tensors_in_spec_order(listening):
    tensors = {k: v.contiguous() for k, v in _sample_tensors().items() if v.numel() > 0}
    port, listener = listen_for_weight_sync("127.0.0.1", "gloo", 2, timeout_s=30) if listening else (free_port(), None)
    received: dict[str, torch.Tensor] = {}

    def sender():
        group = create_weight_sync_group("127.0.0.1", port, 0, 2, "test_group", backend="gloo", timeout_s=30,
                                         listener=listener)
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
    with pytest.raises(ValueError, match="'mpi'"):
        listen_for_weight_sync("127.0.0.1", "mpi", 2)
    with pytest.raises(ValueError, match="rank 1"):
        create_weight_sync_group("127.0.0.1", 1, 1, 2, "g", backend="gloo", listener=object())


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_rank_zero_holds_its_port_before_announcing_it(backend):
    """The announced port is bound and listening already (no other process can take it in between): binding it
    again fails, and a client connects at once."""
    port, listener = listen_for_weight_sync("127.0.0.1", backend, 2, timeout_s=10)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        if backend == "nccl":
            listener.close()


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


# ---------------------------------------------------------------------------------------------- sleep mode
class _SleepModeLLM:
    """Stands in for ``vllm.LLM`` inside a real :class:`VLLMEngine`: sleep mode, weight loads and generation are
    written to a shared event log; the GPU memory it holds is tracked per part like vLLM's allocator."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.resident = {"weights": True, "kv_cache": True}

    def sleep(self, level: int = 1) -> None:
        self.events.append(f"engine.sleep({level})")
        self.resident = {"weights": False, "kv_cache": False}

    def wake_up(self, tags=None) -> None:
        self.events.append(f"engine.wake_up({tags})")
        for tag in tags or self.resident:
            self.resident[tag] = True

    def collective_rpc(self, method, args=()):
        assert self.resident["weights"], "weights loaded into an engine whose weights are asleep"
        self.events.append(f"engine.{method}")
        return [len(args[0])]

    def generate(self, prompts, params, use_tqdm=False):
        assert all(self.resident.values()), f"generation with memory asleep: {self.resident}"
        self.events.append("engine.generate")
        completion = SimpleNamespace(index=0, token_ids=[5, 6], finish_reason="length", logprobs=None)
        return [SimpleNamespace(outputs=[completion]) for _ in prompts]


def _sleep_mode_engine(events: list[str]):
    from openrlhf_hacpo.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # the real class around the stand-in LLM (no model, no vLLM engine)
    engine.llm, engine.asleep, engine.enable_prefix_caching = _SleepModeLLM(events), set(), False
    engine.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "x" * len(ids))
    engine.vocab_size, engine.max_model_len = 16, 64
    return engine


class _PolicyRank:
    """A policy rank in this process: the real weight export (:class:`PolicyIO`) of a small model."""

    def __init__(self, io) -> None:
        self.io = io

    def sync_weights_to_engines(self, engines, mode="object_store"):
        return self.io.sync_weights_to_engines(engines, mode)

    def render_prompts(self, prompts):
        return [[1, 2, 3] for _ in prompts]


def test_a_sync_empties_the_cache_then_wakes_only_the_weights_and_generation_wakes_the_kv_cache(tmp_path,
                                                                                                monkeypatch):
    """Colocated sleep mode, in OpenRLHF's order: the policy empties PyTorch's CUDA cache, the engines get back
    their weights' memory only, the weights are loaded, the cache is emptied again; the KV cache comes back just
    before the next generation, and the engines sleep again after it."""
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy_io import PolicyIO
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.data.prompts import PromptRecord
    from openrlhf_hacpo.engines.base import SamplingConfig

    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("policy.empty_cache"))
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path", str(tmp_path),
                        "--rollout_backend", "vllm", "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
                        "--train_batch_size", "4", "--micro_train_batch_size", "1"])
    group = AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=1)
    group.use_ray = False  # workers in this process
    model = torch.nn.Linear(3, 2)
    io = PolicyIO(cfg.resolved_agents[0], SimpleNamespace(module=model), None, rank=0, world_size=1,
                  device=torch.device("cuda", 0))  # a CUDA rank as far as the cache is concerned
    group.policies = [_PolicyRank(io)]
    group.engines = [_sleep_mode_engine(events), _sleep_mode_engine(events)]
    group.rollouts.engines_sleep = True
    group.call(group.engines, type(group.engines[0]).sleep, [()] * 2, group.plan.engine_role,
               lambda v: v).result()  # engines start asleep after creation
    events.clear()

    group.sync_weights()
    assert events == ["policy.empty_cache", "engine.wake_up(['weights'])", "engine.wake_up(['weights'])",
                      "engine.load_named_tensors", "engine.load_named_tensors", "policy.empty_cache"]
    assert [e.asleep for e in group.engines] == [{"kv_cache"}, {"kv_cache"}]
    assert [e.llm.resident for e in group.engines] == [{"weights": True, "kv_cache": False}] * 2

    events.clear()
    prompts = [PromptRecord("1", "q1", "0"), PromptRecord("2", "q2", "0")]
    outputs = group.generate(prompts, SamplingConfig(n=1, max_new_tokens=2)).result()
    assert [o.response_token_ids for o in outputs] == [[5, 6], [5, 6]]
    assert events == ["engine.wake_up(['kv_cache'])", "engine.wake_up(['kv_cache'])", "engine.generate",
                      "engine.generate", "engine.sleep(1)", "engine.sleep(1)"]
    assert all(e.asleep == {"weights", "kv_cache"} for e in group.engines)


def test_engine_wake_up_wakes_each_part_once_and_rejects_unknown_tags():
    events: list[str] = []
    engine = _sleep_mode_engine(events)
    assert engine.wake_up() == [] and events == []  # awake: nothing to do
    engine.sleep()
    engine.sleep()  # already asleep: one call to vLLM
    assert engine.wake_up(["weights"]) == ["weights"] and engine.sleeping
    assert engine.wake_up(["weights"]) == []
    assert engine.wake_up() == ["kv_cache"] and not engine.sleeping
    assert events == ["engine.sleep(1)", "engine.wake_up(['weights'])", "engine.wake_up(['kv_cache'])"]
    with pytest.raises(ValueError, match=r"unknown memory tag\(s\) \['scheduling'\]"):
        engine.wake_up(["scheduling"])


def test_object_store_push_reaches_engines_in_this_process():
    """Engines that are not Ray actors get the tensors directly (no object store)."""
    from openrlhf_hacpo.engines.weight_sync import push_weights_to_engines

    got = []
    engine = SimpleNamespace(update_weights=lambda pairs: got.append(dict(pairs)) or len(pairs))
    tensors = {"a": torch.randn(2), "b": torch.ones(1, 3)}
    push_weights_to_engines([engine, engine], tensors)
    assert len(got) == 2 and all(torch.equal(g[n], t) for g in got for n, t in tensors.items())
