"""Each agent's memory layout: :class:`AgentLayout`, everything one agent's bytes per GPU depend on (its model's
shape, parallelism, ZeRO stage, precision, batch and sequence sizes, engines, LoRA and offload options), and
:func:`agent_layouts`, which takes the layout (parallelism, engines, colocation, reference, LoRA, offload and sleep)
from the agents' plans (:class:`~openrlhf_hacpo.actors.agent_plan.AgentPlan`), the training settings from the run's
:class:`~openrlhf_hacpo.config.TrainConfig` and the model's shape from its Hugging Face config.

An :class:`AgentLayout` is flat so that the refusal's what-ifs (:func:`~openrlhf_hacpo.trainer.memory_plan.
fitting_options`) can change one field: its bundle count and whether it holds a reference model apply the plan's own
rules (:class:`~openrlhf_hacpo.engines.node_plan.AgentDemand`, :func:`~openrlhf_hacpo.actors.agent_plan.
owns_reference_model`) to its fields."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openrlhf_hacpo.actors.agent_plan import AgentPlan, owns_reference_model
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.node_plan import AgentDemand
from openrlhf_hacpo.trainer.memory_sizes import REDUCE_BUCKET_ELEMENTS, ModelShape

__all__ = ["AgentLayout", "agent_layouts"]


@dataclass(frozen=True)
class AgentLayout:
    """Everything one agent's memory depends on (the formulas are in :mod:`openrlhf_hacpo.trainer.memory_rows`).

    ``reference``: the loss has a KL term (a reference policy is asked for; :attr:`has_reference` says whether it
    is a model of its own)."""

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
    def has_reference(self) -> bool:
        """A reference model of its own (``w P`` on GPU 0 or, offloaded, in host memory): the plan's rule
        (:func:`~openrlhf_hacpo.actors.agent_plan.owns_reference_model`: not for a LoRA agent)."""
        return owns_reference_model(self.reference, self.lora_rank)

    @property
    def policy_gpus(self) -> int:
        """The policy's bundles (:attr:`~openrlhf_hacpo.engines.node_plan.AgentDemand.policy_bundles`)."""
        return AgentDemand(self.name, self.dp, self.engines, self.tensor_parallel, self.colocated).policy_bundles


def agent_layouts(cfg: TrainConfig, plans: Sequence[AgentPlan], model_configs: Mapping[str, Any]) -> list[AgentLayout]:
    """Each agent's :class:`AgentLayout`: its layout from its plan (GPU plans: :func:`~openrlhf_hacpo.actors.
    agent_plan.plan_agents` with ``on_gpu``), the training settings from the run's config (inherited settings
    resolved), the shape from its HF config (``model_configs`` by agent name)."""
    agents = cfg.resolved_agents
    out = []
    for plan in plans:
        agent = agents[plan.index]
        settings = plan.engine_settings
        out.append(AgentLayout(
            name=plan.name, shape=ModelShape.from_config(model_configs[plan.name], f"agent {plan.name!r}"),
            dp=plan.dp, zero_stage=agent.zero_stage, bf16=bool(agent.bf16),
            gradient_checkpointing=bool(agent.gradient_checkpointing), micro_batch=cfg.train.micro_train_batch_size,
            prompt_len=cfg.prompts.prompt_max_len, response_len=cfg.prompts.generate_max_len,
            logprob_path=cfg.compute.logprob_path,
            attn_implementation=agent.attn_implementation, reference=plan.kl, engines=plan.vllm_engines,
            tensor_parallel=plan.tp, colocated=plan.colocated,
            engine_utilization=settings.gpu_memory_utilization if settings is not None else 0.95,
            engine_sleep=settings.enable_sleep_mode if settings is not None else False,
            lora_rank=plan.lora.rank, target_modules=plan.lora.target_modules,
            adam_offload=plan.adam_offload, param_offload=plan.param_offload,
            deepspeed_enable_sleep=plan.deepspeed_enable_sleep, ref_reward_offload=plan.ref_reward_offload,
            accumulation_steps=max(1, cfg.train.train_batch_size // (cfg.train.micro_train_batch_size * plan.dp))))
    return out
