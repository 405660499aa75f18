"""Each agent's memory layout: :class:`AgentLayout`, everything one agent's bytes per GPU depend on (its model's
shape, parallelism, ZeRO stage, precision, batch and sequence sizes, engines, LoRA and offload options), and
:func:`agent_layouts`, which reads them from a run's :class:`~openrlhf_hacpo.config.TrainConfig` and the agents'
Hugging Face configs."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.settings import resolve_engine_settings
from openrlhf_hacpo.trainer.memory_sizes import REDUCE_BUCKET_ELEMENTS, ModelShape

__all__ = ["AgentLayout", "agent_layouts"]


@dataclass(frozen=True)
class AgentLayout:
    """Everything one agent's memory depends on (the formulas are in :mod:`openrlhf_hacpo.trainer.memory_rows`)."""

    name: str
    shape: ModelShape
    dp: int = 1
    zero_stage: int = 2
    bf16: bool = True
    gradient_checkpointing: bool = False
    micro_batch: int = 8
    prompt_len: int = 1024
    response_len: int = 1024
    logprob_path: str = "fused"
    attn_implementation: str = "sdpa"
    reference: bool = True
    engines: int = 0
    tensor_parallel: int = 1
    colocated: bool = False
    engine_utilization: float = 0.95
    engine_sleep: bool = False
    lora_rank: int = 0
    target_modules: str = "all-linear"
    adam_offload: bool = False
    param_offload: bool = False
    deepspeed_enable_sleep: bool = False
    ref_reward_offload: bool = False
    accumulation_steps: int = 1
    bucket_elements: int = REDUCE_BUCKET_ELEMENTS

    def __post_init__(self) -> None:
        if self.param_offload and self.zero_stage != 3:
            raise ValueError(f"agent {self.name!r}: param_offload needs zero_stage 3, got {self.zero_stage}")
        if self.accumulation_steps < 1 or self.bucket_elements < 0:
            raise ValueError(f"agent {self.name!r}: accumulation_steps must be >= 1 and bucket_elements >= 0, got "
                             f"{self.accumulation_steps} and {self.bucket_elements}")

    @property
    def weight_bytes(self) -> int:
        return 2 if self.bf16 else 4

    @property
    def trainable(self) -> int:
        if self.lora_rank > 0:
            return self.shape.lora_parameters(self.lora_rank, self.target_modules)
        return self.shape.parameters()

    @property
    def largest_trainable(self) -> int:
        """Elements of the largest tensor the optimizer holds (DeepSpeed sizes its offload copy buffers by it)."""
        if self.lora_rank > 0:
            return self.shape.largest_lora_parameter(self.lora_rank, self.target_modules)
        return self.shape.largest_parameter()

    @property
    def policy_gpus(self) -> int:
        return max(self.dp, self.engines * self.tensor_parallel) if self.colocated else self.dp



def agent_layouts(cfg: TrainConfig, model_configs: Mapping[str, Any]) -> list[AgentLayout]:
    """Each agent's :class:`AgentLayout` from the run's config (inherited settings resolved) and its HF config.

    The memory options (``lora_rank``, ``target_modules``, ``adam_offload``, ``param_offload``,
    ``deepspeed_enable_sleep``, ``ref_reward_offload``) are read from the agent, else the run, when the config has
    them; absent ones count as off."""
    out = []
    for agent in cfg.resolved_agents():
        def option(name: str, default: Any) -> Any:
            value = getattr(agent, name, None)
            return getattr(cfg, name, default) if value is None else value

        engines = agent.vllm_num_engines if cfg.rollout_backend == "vllm" else 0
        settings = resolve_engine_settings(True, cfg.colocate_all_models,
                                           gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                           enable_sleep=cfg.vllm_enable_sleep)
        out.append(AgentLayout(
            name=agent.name, shape=ModelShape.from_config(model_configs[agent.name], f"agent {agent.name!r}"),
            dp=agent.dp_size, zero_stage=agent.zero_stage, bf16=bool(agent.bf16),
            gradient_checkpointing=bool(agent.gradient_checkpointing), micro_batch=cfg.micro_train_batch_size,
            prompt_len=cfg.prompt_max_len, response_len=cfg.generate_max_len, logprob_path=cfg.logprob_path,
            attn_implementation=agent.attn_implementation, reference=cfg.algo.loss.uses_kl, engines=engines,
            tensor_parallel=agent.vllm_tensor_parallel_size, colocated=cfg.colocate_all_models,
            engine_utilization=settings.gpu_memory_utilization, engine_sleep=settings.enable_sleep_mode,
            lora_rank=int(option("lora_rank", 0) or 0), target_modules=str(option("target_modules", "all-linear")),
            adam_offload=bool(option("adam_offload", False)), param_offload=bool(option("param_offload", False)),
            deepspeed_enable_sleep=bool(option("deepspeed_enable_sleep", False)),
            ref_reward_offload=bool(option("ref_reward_offload", False)),
            accumulation_steps=max(1, cfg.train_batch_size // (cfg.micro_train_batch_size * agent.dp_size))))
    return out
