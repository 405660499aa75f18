"""transformers `generate` in a process of its own: the `hf_engine` rollout backend.

`HFEngine` holds its own copy of an agent's model, loaded from the agent's `pretrain` folder exactly as the policy
loads it (same dtype, attention implementation, tokenizer and EOS ids), and samples with `HFGenerateEngine`. It takes
new weights the way a CPU vLLM engine does (`update_weights`, called by the object-store path of
:mod:`openrlhf_hacpo.engines.weight_sync`), so an agent group drives both kinds of engine actor through one code
path: render on the policy, generate on the engine, score on the policy, sync after the update.

With the same prompts, seed and weights it returns exactly what the policy's in-process `generate` returns (the
`hf` backend): the batches are cut the same way (`GENERATE_BATCH_ROWS` rows) and a seeded call runs under the same
forked torch RNG. Running apart from the policy is what lets an agent generate while its policy trains.

CPU cores: a :class:`~openrlhf_hacpo.engines.settings.CoreShare` pins the engine process (every thread of it) to its
share of its node's cores and gives torch one thread per core (:func:`bind_to_share`); without one, or when the node
has fewer cores than the run has busy processes, the process keeps its affinity and the thread count of its
environment (`OMP_NUM_THREADS`).
"""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from openrlhf_hacpo.engines.base import GenerationOutput, NamedTensors, SamplingConfig, iter_named_tensors
from openrlhf_hacpo.engines.hf_generate import GENERATE_BATCH_ROWS, HFGenerateEngine, resolve_eos_token_ids
from openrlhf_hacpo.engines.settings import CoreShare

__all__ = ["HFEngine", "bind_process_to_cores", "bind_to_share", "create_hf_engine", "hf_engine_actor_class",
           "load_generation_model"]


def bind_process_to_cores(cores: Sequence[int]) -> list[int]:
    """Pin every thread of this process to ``cores`` and give torch one intra-op thread per core.

    ``os.sched_setaffinity(0, ...)`` moves only the calling thread, so each thread of ``/proc/self/task`` is moved
    (threads started later inherit the mask of the thread that starts them). Returns the process's affinity
    afterwards. Raises ValueError naming the cores when one is not available to this process.
    """
    wanted = sorted({int(core) for core in cores})
    if not wanted:
        raise ValueError("bind_process_to_cores: no cores given")
    available = os.sched_getaffinity(0)
    missing = [core for core in wanted if core not in available]
    if missing:
        raise ValueError(f"bind_process_to_cores: cores {missing} are not available to this process "
                         f"(its cores: {sorted(available)})")
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread alone
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except OSError:  # the thread ended meanwhile
            pass
    torch.set_num_threads(len(wanted))
    return sorted(os.sched_getaffinity(0))


def bind_to_share(share: CoreShare | None) -> list[int] | None:
    """Pin this process to its :class:`~openrlhf_hacpo.engines.settings.CoreShare` of this node's cores; returns the
    cores, or None when the share pins nothing (fewer cores than busy processes) or ``share`` is None."""
    if share is None:
        return None
    cores = share.cores(sorted(os.sched_getaffinity(0)))
    return bind_process_to_cores(cores) if cores is not None else None


def load_generation_model(pretrain: str, bf16: bool, attn_implementation: str | None, owner: str):
    """The agent's model as the policy loads it (same dtype and attention implementation), in eval mode."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(pretrain, dtype=torch.bfloat16 if bf16 else torch.float32,
                                                     attn_implementation=attn_implementation)
    except OSError as err:
        raise FileNotFoundError(f"{owner}: cannot load the model from {pretrain!r}: {err}") from err
    return model.eval()


class HFEngine:
    """One agent's transformers-``generate`` rollout engine, meant to run as a Ray actor (:func:`create_hf_engine`).

    Args:
        pretrain: the agent's model folder (the policy's initial weights).
        tokenizer: the agent's tokenizer folder or id (``AgentConfig.tokenizer_path``).
        chat_template: the agent's chat-template override (EOS and pad ids come from the tokenizer it yields).
        bf16: load the weights in bfloat16 (the plan's engine precision, ``--engine_dtype``), else float32; the
            weight sync casts the policy's tensors to it.
        attn_implementation: passed to ``from_pretrained`` as the policy passes it.
        seed: seeds the torch RNG at start (drives calls without a seed of their own).
        core_share: this engine's share of its node's cores (:func:`bind_to_share`); None leaves the process as
            it is.
        owner: names the engine in errors (``agent 'qwen' HF engine``).
    """

    def __init__(self, pretrain: str, *, tokenizer: str | None = None, chat_template: str | None = None,
                 bf16: bool = False, attn_implementation: str | None = None, seed: int = 0,
                 core_share: CoreShare | None = None, owner: str = "HF engine") -> None:
        from openrlhf_hacpo.models.tokenizer import load_tokenizer

        self.owner = owner
        self.cpu_cores = bind_to_share(core_share)
        torch.manual_seed(seed)
        self.tokenizer = load_tokenizer(tokenizer or pretrain, chat_template, owner=owner)
        self.model = load_generation_model(pretrain, bf16, attn_implementation, owner)
        self.engine = HFGenerateEngine(self.model, self.tokenizer, max_batch_size=GENERATE_BATCH_ROWS,
                                       eos_token_ids=resolve_eos_token_ids(self.model, self.tokenizer))
        # the policy's engine takes the size from the config too (a ZeRO-3 embedding has no local shape)
        self.engine.vocab_size = int(self.model.config.vocab_size)
        self.loaded_names = set(self.model.state_dict().keys())
        self.last_generate_s = 0.0

    def ready(self) -> dict[str, Any]:
        """Where the engine runs: its pid, its cores and torch's thread count."""
        return {"pid": os.getpid(), "cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.engine.eos_token_ids)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """`sampling.n` responses per prompt, prompt-major (:meth:`HFGenerateEngine.generate`); timed
        (:meth:`last_generate_seconds`)."""
        started = time.perf_counter()
        outputs = self.engine.generate(prompt_token_ids, sampling)
        self.last_generate_s = time.perf_counter() - started
        return outputs

    def last_generate_seconds(self) -> float:
        """How long the last :meth:`generate` call ran in this process (0.0 before the first)."""
        return self.last_generate_s

    def update_weights(self, named_tensors: NamedTensors) -> int:
        """Object-store path: copy HF-named tensors into the model; returns how many were given.

        Every tensor of the model's state dict must be among them (a partial sync would leave the engine sampling
        from a mix of two policies): a missing name raises ValueError naming it, an unknown name KeyError, a shape
        mismatch ValueError (:meth:`HFGenerateEngine.update_weights`).
        """
        pairs = list(iter_named_tensors(named_tensors))
        missing = sorted(self.loaded_names - {name for name, _ in pairs})
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ValueError(f"{self.owner}: the weight sync left out {len(missing)} tensor(s) of the model: {shown}")
        self.engine.update_weights(pairs)
        return len(pairs)


@functools.cache
def hf_engine_actor_class():
    """``ray.remote(HFEngine)``, made on first use (importing this module does not import Ray)."""
    import ray

    return ray.remote(HFEngine)


def create_hf_engine(agent: Any, dtype: str, *, seed: int, core_share: CoreShare | None = None,
                     scheduling_strategy: Any = None):
    """Start one :class:`HFEngine` actor for ``agent`` (an :class:`~openrlhf_hacpo.config.AgentConfig`) with its
    weights in ``dtype`` (``float32`` or ``bfloat16``: the plan's engine precision); its model loads while the caller
    goes on (``engine.ready.remote()`` resolves once it has).

    The actor asks Ray for no CPU (like the policy actors: cores are split by pinning, ``core_share``);
    ``scheduling_strategy`` places it (the agent group puts it in its policy's placement group, on rank 0's node).
    """
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0}
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    engine = hf_engine_actor_class().options(**options).remote(
        agent.pretrain, tokenizer=agent.tokenizer_path, chat_template=agent.chat_template, bf16=dtype == "bfloat16",
        attn_implementation=agent.attn_implementation, seed=seed,
        core_share=core_share, owner=f"agent {agent.name!r} HF engine")
    return engine
