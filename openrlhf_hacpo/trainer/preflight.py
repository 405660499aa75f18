"""Checks and resolutions run before any Ray worker starts, so a run that cannot start fails in seconds, naming the
agent at fault and the values that would work:

* `resolve_hub_models`: the vLLM backend loads models from local folders; an agent whose ``pretrain`` is a hub id
  is downloaded with ``huggingface_hub.snapshot_download`` (or found in the local cache), else a clear error says
  which folder to set.
* `resolve_attention`: ``flash_attention_2`` needs the flash-attn package (a separate install step, docs/gpu.md) to
  *import*: a build made against another torch is installed but fails on import (undefined symbols), and would stop
  every policy and reference worker in ``from_pretrained``; either way the agents fall back to ``sdpa`` with a
  warning that gives the reason.
* `check_gpu_count`: the GPUs every agent's plan needs (policy ranks, plus dedicated engine GPUs;
  :class:`~openrlhf_hacpo.actors.agent_plan.AgentPlan`) against the cluster's; three 4-GPU agents on 8 GPUs would
  otherwise wait forever for their placement groups.
* `check_node_placement`: every agent's GPU bundles (CPU bundles on a CPU-only cluster) against each node's real size
  (``ray.nodes()``), through the node planner (:mod:`openrlhf_hacpo.engines.node_plan`): the plans with the node of
  every bundle, or an error naming the agent, its bundles and every node's free GPUs or CPUs (a 6-GPU agent does not
  fit two nodes with 4 free each, though 8 GPUs are free in all).
* `check_vllm_compatibility`: each agent's architecture against the vLLM attention backends of the device for the
  agent's dtype (head size: FlashAttention runs fp16/bf16 only, so fp32 needs Triton's head sizes >= 32) and the
  context the run asks for (prompt + generation length against the model's maximum).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from openrlhf_hacpo.actors.agent_plan import AgentPlan, with_nodes
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.node_plan import ClusterNode, plan_nodes

__all__ = ["CUDA_ATTENTION_BACKENDS", "AttentionBackend", "GpuDemand", "check_gpu_count", "check_node_placement",
           "check_vllm_compatibility", "flash_attn_import_error", "gpu_demand", "resolve_attention",
           "resolve_hub_models", "vllm_head_sizes"]

logger = logging.getLogger(__name__)

# vLLM 0.32's CPU attention backend (`CPUAttentionBackend.get_supported_head_sizes`); read from the installed
# backend when it imports, this list otherwise.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
ENGINE_DTYPES = {"cpu": (torch.float16, torch.bfloat16, torch.float32),
                 "cuda": (torch.float16, torch.bfloat16, torch.float32)}


@dataclass(frozen=True)
class AttentionBackend:
    """One of vLLM's CUDA attention backends: its name, the dtypes it runs and its head-size rule (stated in words
    for error messages)."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    supports: Callable[[int], bool]
    rule: str


# vLLM 0.32's CUDA attention backends for decoder models, in its order of preference on Hopper and earlier
# (`vllm/platforms/cuda.py::_get_backend_priorities`): FlashAttention (`FlashAttentionBackend`: fp16/bf16, head
# sizes that are multiples of 8 up to 256) and, as its fallback, Triton (`TritonAttentionBackend`: fp16/bf16/fp32,
# head sizes >= 32). FlashInfer (fp16/bf16; 64, 128, 256, 512) adds no head size to these. FlexAttention, the last
# resort, is not counted: no run of this project has used it.
CUDA_ATTENTION_BACKENDS = (
    AttentionBackend("FlashAttention", (torch.float16, torch.bfloat16), lambda size: size % 8 == 0 and size <= 256,
                     "a multiple of 8 up to 256 in fp16/bf16"),
    AttentionBackend("Triton", (torch.float16, torch.bfloat16, torch.float32), lambda size: size >= 32,
                     ">= 32 in any dtype"),
)


# ---------------------------------------------------------------------------------------------------------- GPUs
@dataclass(frozen=True)
class GpuDemand:
    """GPUs one agent occupies: policy ranks (the reference and colocated engines share theirs) and dedicated
    engine GPUs."""

    agent: str
    policy: int
    engines: int

    @property
    def total(self) -> int:
        return self.policy + self.engines


def gpu_demand(plans: Sequence[AgentPlan]) -> list[GpuDemand]:
    """Per agent: its plan's policy bundles (``dp_size``, or max(dp, engines * tp) with ``--colocate_all_models``,
    whose engines sit on the policy's bundles) and dedicated engine GPUs (``vllm_num_engines * tp``): the bundle
    counts the node placement takes too (:attr:`~openrlhf_hacpo.actors.agent_plan.AgentPlan.demand`)."""
    return [GpuDemand(p.name, p.policy_bundles, p.engine_bundles) for p in plans]


def check_gpu_count(plans: Sequence[AgentPlan], cluster_gpus: float) -> None:
    """Raise ``ValueError`` when the agents need more GPUs than the Ray cluster has, listing every agent's count."""
    demands = gpu_demand(plans)
    needed = sum(d.total for d in demands)
    if needed <= cluster_gpus:
        return
    parts = ", ".join(f"{d.agent!r} {d.total} ({d.policy} policy"
                      + (f" + {d.engines} vLLM" if d.engines else "") + ")" for d in demands)
    layout = "colocated" if any(p.colocate for p in plans) else "dedicated engine GPUs"
    raise ValueError(f"the agents need {needed} GPUs ({layout}): {parts}; the Ray cluster has {cluster_gpus:g}. "
                     "Lower dp_size / vllm_num_engines / vllm_tensor_parallel_size, use --colocate_all_models, "
                     "or add nodes")


def check_node_placement(plans: Sequence[AgentPlan], nodes: Sequence[ClusterNode],
                         allow_straddle: bool = False) -> list[AgentPlan]:
    """``plans`` with the node of every bundle (:attr:`~openrlhf_hacpo.actors.agent_plan.AgentPlan.nodes`): their
    demands placed by :func:`~openrlhf_hacpo.engines.node_plan.plan_nodes` (GPU bundles, or CPU bundles for plans of
    a CPU-only run; ``allow_straddle`` is ``--allow_straddle``); raises
    :class:`~openrlhf_hacpo.engines.node_plan.PlacementError` (a ``ValueError``) when the agents do not fit the nodes
    or a pin names no single node."""
    kinds = {p.bundle_kind for p in plans}
    if len(kinds) != 1:
        raise ValueError(f"the plans mix bundle kinds {sorted(kinds)}: plan every agent for the same device")
    placements = plan_nodes(nodes, [p.demand for p in plans], allow_straddle=allow_straddle, kind=kinds.pop())
    return with_nodes(plans, placements)


# ---------------------------------------------------------------------------------------------------------- vLLM
def vllm_head_sizes(device: str, dtype: torch.dtype = torch.bfloat16) -> Callable[[int], bool]:
    """Whether the device's vLLM attention backends support a head size for attention in ``dtype``.

    CPU: the CPU backend's list (any dtype). GPU: any backend of :data:`CUDA_ATTENTION_BACKENDS` that runs
    ``dtype`` and takes the size: in fp16/bf16 FlashAttention's multiples of 8 up to 256 or Triton's >= 32; in fp32
    only Triton's >= 32.
    """
    if device == "cpu":
        sizes = CPU_HEAD_SIZES
        try:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            sizes = tuple(CPUAttentionBackend.get_supported_head_sizes())
        except Exception:  # noqa: BLE001 - vllm absent or laid out differently: keep the pinned line's list
            pass
        return lambda size: size in sizes
    backends = [b for b in CUDA_ATTENTION_BACKENDS if dtype in b.dtypes]
    return lambda size: any(b.supports(size) for b in backends)


def _head_size_rule(device: str, dtype: torch.dtype) -> str:
    if device == "cpu":
        return f"one of {', '.join(map(str, CPU_HEAD_SIZES))}"
    backends = [b for b in CUDA_ATTENTION_BACKENDS if dtype in b.dtypes]
    rule = "; ".join(f"{b.name}: {b.rule}" for b in backends)
    skipped = [b.name for b in CUDA_ATTENTION_BACKENDS if dtype not in b.dtypes]
    if skipped:
        rule += f" ({', '.join(skipped)} does not run {str(dtype).removeprefix('torch.')})"
    return rule


def _head_size(config) -> int | None:
    head = getattr(config, "head_dim", None)
    if head:
        return int(head)
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    return int(hidden) // int(heads) if hidden and heads else None


def _rope_scaled(config) -> bool:
    """RoPE scaling stretches the usable context beyond ``max_position_embeddings`` (vLLM applies the factor)."""
    for name in ("rope_scaling", "rope_parameters"):
        params = getattr(config, name, None)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) not in (None, "default"):
            return True
    return False


def check_vllm_compatibility(cfg: TrainConfig, model_configs: Mapping[str, Any], device: str) -> None:
    """Raise ``ValueError`` naming the agent when its model cannot run on the device's vLLM backend (the context
    check is skipped for RoPE-scaled models, whose limit vLLM derives from the scaling).

    ``model_configs`` maps agent names to their Hugging Face configs; ``device`` is "cpu" or "cuda".
    """
    # the engines are sized for the longer of rollout and evaluation responses
    context = cfg.prompts.prompt_max_len + max(cfg.prompts.generate_max_len, cfg.eval.eval_generate_max_len or 0)
    for agent in cfg.resolved_agents:
        config = model_configs[agent.name]
        dtype = getattr(torch, agent.resolved_engine_dtype)  # the engines' precision (--engine_dtype)
        head = _head_size(config)
        if head is not None and not vllm_head_sizes(device, dtype)(head):
            in_dtype = f" in {str(dtype).removeprefix('torch.')}" if device == "cuda" else ""
            raise ValueError(f"agent {agent.name!r}: head size {head} of {agent.pretrain!r} is not supported by "
                             f"vLLM's {device} attention backend (supported{in_dtype}: "
                             f"{_head_size_rule(device, dtype)}); use --rollout_backend hf for this run"
                             + (" or --engine_dtype bfloat16" if device == "cuda" and dtype == torch.float32 else ""))
        if dtype not in ENGINE_DTYPES[device]:
            raise ValueError(f"agent {agent.name!r}: vLLM on {device} does not run {dtype}")
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and not _rope_scaled(config) and context > int(limit):
            raise ValueError(f"agent {agent.name!r}: the engines' context, prompt_max_len + the longer of "
                             f"generate_max_len and eval_generate_max_len = {context}, exceeds the model's "
                             f"max_position_embeddings = {limit} ({agent.pretrain!r}); lower --prompt_max_len / "
                             "--generate_max_len / --eval_generate_max_len")


# ---------------------------------------------------------------------------------------------------------- models
def flash_attn_import_error() -> str | None:
    """None when the flash-attn package imports; else why not ("not installed", or the exception it raised, e.g.
    the undefined symbol of a build made against another torch)."""
    if importlib.util.find_spec("flash_attn") is None:
        return "not installed"
    try:
        importlib.import_module("flash_attn")
    except Exception as err:  # noqa: BLE001 - ImportError, OSError (a missing CUDA library), RuntimeError, ...
        first = str(err).splitlines()[0] if str(err) else ""
        return f"installed but its import fails: {type(err).__name__}: {first}"
    return None


def resolve_attention(cfg: TrainConfig, flash_attn_available: bool | None = None) -> list[str]:
    """Replace ``flash_attention_2`` by ``sdpa`` when flash-attn does not import; returns the agents changed.

    ``flash_attn_available`` overrides the check (:func:`flash_attn_import_error`, which imports the package)."""
    changed = [a.name for a in cfg.resolved_agents if a.attn_implementation == "flash_attention_2"]
    if not changed:
        return []
    reason = "not importable" if flash_attn_available is False else None
    if flash_attn_available is None:
        reason = flash_attn_import_error()
    if reason is None:
        return []
    if cfg.agent_defaults.attn_implementation == "flash_attention_2":
        cfg.agent_defaults.attn_implementation = "sdpa"
    for agent in cfg.agents:
        if agent.attn_implementation == "flash_attention_2":
            agent.attn_implementation = "sdpa"
    cfg.validate()  # the agents resolved again, with the change
    logger.warning("flash-attn is %s: agents %s use attn_implementation='sdpa' (install a flash-attn built for this "
                   "torch as in docs/gpu.md to use flash_attention_2)", reason, changed)
    return changed


def _is_local(path: str) -> bool:
    return os.path.exists(path) or os.path.isabs(path) or path.startswith((".", "~"))


def resolve_hub_models(cfg: TrainConfig, download: Callable[..., str] | None = None) -> dict[str, str]:
    """With the vllm backend, replace each hub id in the agents' ``pretrain`` by a local snapshot folder.

    ``download`` defaults to ``huggingface_hub.snapshot_download`` (which answers from the local cache when the hub
    is unreachable or ``HF_HUB_OFFLINE=1``). Returns {agent: folder} of the agents resolved; raises
    ``FileNotFoundError`` naming the agent and what to set when the model cannot be had.
    """
    if cfg.rollout.rollout_backend != "vllm":
        return {}
    if download is None:
        from huggingface_hub import snapshot_download as download
    resolved: dict[str, str] = {}
    for agent in cfg.agents:
        if _is_local(agent.pretrain):
            continue
        try:
            folder = download(repo_id=agent.pretrain)
        except Exception as err:  # noqa: BLE001 - offline, unknown id, gated model: all end in the same advice
            raise FileNotFoundError(
                f"agent {agent.name!r}: the vllm backend needs a local model folder and {agent.pretrain!r} could not "
                f"be downloaded from the Hugging Face hub ({type(err).__name__}: {str(err).splitlines()[0]}). "
                f"Download it where the hub is reachable (huggingface-cli download {agent.pretrain} --local-dir "
                f"DIR) and set pretrain=DIR for this agent (MODEL_A / MODEL_B in the launchers)") from err
        logger.info("agent %r: %s resolved to %s", agent.name, agent.pretrain, folder)
        agent.pretrain = folder  # an agent without its own tokenizer reads it from the same folder
        resolved[agent.name] = folder
    if resolved:
        cfg.validate()  # the agents resolved again, with their folders
    return resolved


def load_model_configs(cfg: TrainConfig) -> dict[str, Any]:
    from transformers import AutoConfig

    return {agent.name: AutoConfig.from_pretrained(agent.pretrain) for agent in cfg.resolved_agents}


def run_gpu_stack_preflight(cfg: TrainConfig, plans: Sequence[AgentPlan], cluster_gpus: float | None) -> None:
    """The checks that need the device decision (after Ray is up; ``plans`` are the agents' plans for that device):
    GPU counts, vLLM compatibility and, on GPUs, the memory plan."""
    use_gpu = any(p.on_gpu for p in plans)
    if use_gpu and cfg.cluster.use_ray and cluster_gpus is not None:
        check_gpu_count(plans, cluster_gpus)
    if cfg.rollout.rollout_backend == "vllm":
        check_vllm_compatibility(cfg, load_model_configs(cfg), "cuda" if use_gpu else "cpu")
    if use_gpu:  # bytes per agent and GPU, refused when a GPU cannot hold its share (trainer/memory_check.py)
        from openrlhf_hacpo.trainer.memory_check import launch_memory_plan

        launch_memory_plan(cfg, plans, load_model_configs(cfg), log=logger.info)
