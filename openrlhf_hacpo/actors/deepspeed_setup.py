"""An agent's policy inside a DeepSpeed engine: the process group, the optimizer, the schedule and the engine.

:func:`init_agent_process_group` joins this rank to its agent's own ``torch.distributed`` group (gloo on CPU, NCCL
on GPU), so agents never synchronise with each other; :func:`build_policy_engine` loads the model and wraps it in
DeepSpeed with :class:`SkippableAdamW` (how a non-finite loss skips an update) and the learning-rate schedule
(:class:`SkipAwareScheduler`: a skipped update does not advance it).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.utils.network import free_port

__all__ = ["TrainingParts", "SkipAwareScheduler", "SkippableAdamW", "build_ds_config", "build_policy_engine",
           "init_agent_process_group"]


class SkippableAdamW(torch.optim.AdamW):
    """AdamW whose ``step`` is a no-op while ``skip_next_step`` is True.

    DeepSpeed runs its whole update path (gradient reduction, clipping, fp32 master copy, zeroing) unchanged; only
    the parameter and moment update is left out, which is how a non-finite loss skips an update.

    One ``engine.step()`` calls this optimizer's ``step`` several times under ZeRO: once per parameter group
    (ZeRO-1/2, ``DeepSpeedZeroOptimizer._optimizer_step``) or per parameter sub-group (ZeRO-3,
    ``DeepSpeedZeroOptimizer_Stage3._optimizer_step``), each time with ``param_groups`` narrowed to that group. The
    flag therefore never clears itself: the caller sets it before ``engine.step()`` and clears it afterwards, so
    every group of the update is skipped and no Adam step counter advances.
    """

    skip_next_step: bool = False

    def step(self, closure=None):  # noqa: D102 - torch API
        if self.skip_next_step:
            return None
        return super().step(closure)


class SkipAwareScheduler:
    """A learning-rate scheduler that does not advance on an update :class:`SkippableAdamW` skipped.

    ``DeepSpeedEngine.step()`` steps the client scheduler after every optimizer step unless *its own* fp16 overflow
    check fired; it knows nothing of a skip decided by the caller, so without this wrapper a skipped update would
    still consume one step of the schedule (warm-up and decay would run ahead of the updates actually made). The
    schedule's position therefore always equals the number of updates applied: lr after n applied updates is
    ``base_lr * lr_lambda(n)``, skips or not. Everything else (``state_dict``, ``load_state_dict``,
    ``get_last_lr``, ...) is the wrapped scheduler's, so checkpoints hold the same state as before.
    """

    def __init__(self, scheduler: Any, optimizer: SkippableAdamW) -> None:
        self.scheduler = scheduler
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.optimizer.skip_next_step:
            return
        self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def __getattr__(self, name: str) -> Any:
        # only reached for names this class does not define; guards against recursion before __init__ ran
        if name in ("scheduler", "optimizer"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)


def build_ds_config(cfg: TrainConfig, agent: AgentConfig) -> dict[str, Any]:
    """DeepSpeed config of an agent's policy engine (ZeRO stage, bf16, clipping, accumulation)."""
    gas = cfg.train_batch_size // (cfg.micro_train_batch_size * agent.dp_size)
    zero: dict[str, Any] = {"stage": agent.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if agent.zero_stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    return {
        "train_batch_size": cfg.train_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_train_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(agent.bf16)},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _lr_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_updates: int):
    from transformers import get_scheduler

    name = cfg.lr_scheduler
    kwargs: dict[str, Any] = {}
    if name == "cosine":
        name, kwargs = "cosine_with_min_lr", {"min_lr_rate": cfg.min_lr_ratio}
    warmup = cfg.lr_warmup_steps if name != "constant" else None
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max(total_updates, 1),
                         scheduler_specific_kwargs=kwargs or None)


def _grouped_parameters(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; biases and norm weights (1-D) are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        ndim = len(getattr(param, "ds_shape", param.shape))  # ZeRO-3 partitions hold a flat local shard
        (no_decay if ndim < 2 or name.endswith(".bias") else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def init_agent_process_group(cfg: TrainConfig, agent: AgentConfig, rank: int, world_size: int,
                             master_addr: str | None, master_port: int | None, device: torch.device) -> None:
    """Join (or create) the agent's process group; a process already in a group of another size is an error."""
    import deepspeed

    if torch.distributed.is_initialized():
        if torch.distributed.get_world_size() != world_size:
            raise RuntimeError(
                f"agent {agent.name!r}: this process already belongs to a process group of size "
                f"{torch.distributed.get_world_size()}, expected {world_size}")
        return
    os.environ["MASTER_ADDR"] = master_addr or cfg.bind_host
    os.environ["MASTER_PORT"] = str(master_port or free_port(os.environ["MASTER_ADDR"]))
    if cfg.ray_address is None and cfg.bind_host in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pair connections on loopback too
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device() if device.type == "cuda" else 0)
    backend = "nccl" if device.type == "cuda" else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)


@dataclass
class TrainingParts:
    """What one rank trains with (a record, not an engine): the DeepSpeed engine, the HF model inside it, the optimizer
    DeepSpeed wraps and the learning-rate schedule."""

    engine: Any
    model: torch.nn.Module
    client_optimizer: SkippableAdamW
    scheduler: Any
    hf_ds_config: Any = None
    """ZeRO-3: transformers' handle that partitions weights while loading (kept alive with the engine)."""


def build_policy_engine(cfg: TrainConfig, agent: AgentConfig, total_updates: int) -> TrainingParts:
    """Load the agent's model and wrap it in DeepSpeed (ZeRO-3 partitions it while loading)."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ds_config = build_ds_config(cfg, agent)
    dtype = torch.bfloat16 if agent.bf16 else torch.float32
    hf_ds_config = None
    if agent.zero_stage == 3:
        from transformers.integrations import HfDeepSpeedConfig

        hf_ds_config = HfDeepSpeedConfig(ds_config)
    try:
        model = AutoModelForCausalLM.from_pretrained(agent.pretrain, dtype=dtype,
                                                     attn_implementation=agent.attn_implementation)
    except OSError as err:
        raise FileNotFoundError(f"agent {agent.name!r}: cannot load the model from {agent.pretrain!r}: {err}") \
            from err
    if hf_ds_config is not None and not cfg.use_ray:
        # several agents share this process: ZeRO-3 partitioning must not leak into the next agent's load
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    if agent.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    optimizer = SkippableAdamW(_grouped_parameters(model, cfg.l2), lr=agent.learning_rate,
                               betas=tuple(cfg.adam_betas))
    scheduler = SkipAwareScheduler(_lr_scheduler(cfg, optimizer, total_updates), optimizer)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=ds_config, dist_init_required=False)
    return TrainingParts(engine=engine, model=engine.module, client_optimizer=optimizer, scheduler=scheduler,
                        hf_ds_config=hf_ds_config)
