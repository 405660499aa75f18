"""An agent's policy inside a DeepSpeed engine: the process group, the optimizer, the schedule and the engine.

:func:`init_agent_process_group` joins this rank to its agent's own ``torch.distributed`` group (gloo on CPU, NCCL
on GPU), so agents never synchronise with each other; :func:`build_policy_engine` loads the model and wraps it in
DeepSpeed with a skippable Adam (:class:`SkippableAdamW`, or with ``adam_offload`` the CPU Adam of
:func:`skippable_cpu_adam_class`: how a non-finite loss skips an update) and the learning-rate schedule
(:class:`SkipAwareScheduler`: a skipped update does not advance it). :class:`EngineStateSleep` moves the engine's
states off the device while colocated rollout engines generate (``deepspeed_enable_sleep``).
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from openrlhf_hacpo.actors.agent_plan import LoraPlan
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.utils import network
from openrlhf_hacpo.utils.network import gloo_interface, host_interfaces, is_loopback
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja

__all__ = ["EngineStateSleep", "TrainingParts", "SkipAwareScheduler", "SkippableAdamW", "SkippableOptimizer",
           "SkipStepMixin", "binds_cuda_device", "build_ds_config", "build_optimizer", "build_policy_engine",
           "init_agent_process_group", "listening_store", "skippable_cpu_adam_class"]


class SkippableOptimizer(Protocol):
    """What the update loop and :class:`SkipAwareScheduler` need of the client optimizer: a ``skip_next_step``
    flag (set before ``engine.step()``, cleared afterwards) and torch's ``param_groups``."""

    skip_next_step: bool
    param_groups: list[dict[str, Any]]


class SkipStepMixin:
    """Makes a torch optimizer's ``step`` a no-op while ``skip_next_step`` is True (mixed in before the optimizer).

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


class SkippableAdamW(SkipStepMixin, torch.optim.AdamW):
    """torch's AdamW with the ``skip_next_step`` flag of :class:`SkipStepMixin` (states on the parameters' device)."""


@functools.cache
def skippable_cpu_adam_class() -> type:
    """DeepSpeed's ``DeepSpeedCPUAdam`` (AdamW mode) with the ``skip_next_step`` flag of :class:`SkipStepMixin`.

    The optimizer of ``adam_offload``: DeepSpeed's ``offload_optimizer`` accepts only its own CPU optimizers, so the
    skip lives on a subclass of one. It is stepped per (sub-)group exactly like :class:`SkippableAdamW`, and its
    ``step_subgroup`` (the per-sub-group entry point some ZeRO-3 paths use) honours the flag too. Made on first use:
    the class statement imports DeepSpeed, and the first instance JIT-builds DeepSpeed's ``cpu_adam`` op (cached in
    ``TORCH_EXTENSIONS_DIR``; ``scripts/install.sh`` prebuilds it).
    """
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    class SkippableCPUAdam(SkipStepMixin, DeepSpeedCPUAdam):
        __doc__ = "DeepSpeedCPUAdam whose ``step`` (and ``step_subgroup``) is a no-op while ``skip_next_step`` is set."

        def step_subgroup(self, subgroup_id: int, closure=None):  # noqa: D102 - DeepSpeed API
            if self.skip_next_step:
                return None
            return super().step_subgroup(subgroup_id, closure)

    return SkippableCPUAdam


def build_optimizer(params: Any, agent: AgentConfig, lr: float, betas: tuple[float, float]) -> SkippableOptimizer:
    """The agent's skippable AdamW: :class:`SkippableAdamW`, or the CPU Adam of :func:`skippable_cpu_adam_class`
    when ``agent.adam_offload`` keeps the optimizer states (and the update) on the CPU. Both compute decoupled
    weight decay AdamW with bias correction, eps 1e-8."""
    if agent.adam_offload:
        use_interpreter_ninja()  # the first instance builds (or finds built) DeepSpeed's cpu_adam op
        return skippable_cpu_adam_class()(params, lr=lr, betas=betas, adamw_mode=True)
    return SkippableAdamW(params, lr=lr, betas=betas)


class SkipAwareScheduler:
    """A learning-rate scheduler that does not advance on an update the client optimizer skipped
    (:class:`SkippableOptimizer`).

    ``DeepSpeedEngine.step()`` steps the client scheduler after every optimizer step unless *its own* fp16 overflow
    check fired; it knows nothing of a skip decided by the caller, so without this wrapper a skipped update would
    still consume one step of the schedule (warm-up and decay would run ahead of the updates actually made). The
    schedule's position therefore always equals the number of updates applied: lr after n applied updates is
    ``base_lr * lr_lambda(n)``, skips or not. Everything else (``state_dict``, ``load_state_dict``,
    ``get_last_lr``, ...) is the wrapped scheduler's, so checkpoints hold the same state as before.
    """

    def __init__(self, scheduler: Any, optimizer: SkippableOptimizer) -> None:
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


def build_ds_config(cfg: TrainConfig, agent: AgentConfig, *, gloo: bool = False) -> dict[str, Any]:
    """DeepSpeed config of an agent's policy engine (ZeRO stage, bf16, clipping, accumulation, CPU offload).

    ``adam_offload`` adds ``offload_optimizer`` (fp32 master weights, Adam moments and the update on the CPU; ZeRO
    1-3) and ``param_offload`` adds ``offload_param`` (ZeRO-3's parameter partitions on the CPU between uses), both
    in pinned memory.

    ``gloo`` (the agent's process group is gloo, i.e. it trains on the CPU) makes ZeRO-3 gather parameters one at a
    time (``stage3_allgather_sequential``). DeepSpeed's blocking gather of several parameters at once (what
    ``deepspeed.zero.GatheredParameters`` runs: weight export, ``save_hf``, LoRA merges) launches one asynchronous
    all-gather per parameter and waits on the last one only. NCCL completes the ops of one stream in order, so that
    is enough on GPUs; gloo runs the ops of a group on several threads, so an earlier gather can still be writing
    when the tensors are read, and a weight read back holds stale memory in places (seen on a layer-norm weight of a
    two-rank run on a loaded machine). The sequential path waits on every gather.
    """
    gas = cfg.train.train_batch_size // (cfg.train.micro_train_batch_size * agent.dp_size)
    zero: dict[str, Any] = {"stage": agent.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if agent.zero_stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
        if gloo:
            zero["stage3_allgather_sequential"] = True
    if agent.adam_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if agent.param_offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_batch_size": cfg.train.train_batch_size,
        "train_micro_batch_size_per_gpu": cfg.train.micro_train_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.optim.max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(agent.bf16)},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _lr_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_updates: int):
    from transformers import get_scheduler

    name = cfg.optim.lr_scheduler
    kwargs: dict[str, Any] = {}
    if name == "cosine":
        name, kwargs = "cosine_with_min_lr", {"min_lr_rate": cfg.optim.min_lr_ratio}
    warmup = cfg.optim.lr_warmup_steps if name != "constant" else None
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


def listening_store(host: str, world_size: int) -> torch.distributed.TCPStore:
    """Rank 0's store for its agent's process group (:func:`openrlhf_hacpo.utils.network.listening_store`, listening
    before its port is announced) with DeepSpeed's process-group timeout."""
    from deepspeed.constants import default_pg_timeout

    return network.listening_store(host, world_size, default_pg_timeout)


def binds_cuda_device(device: torch.device) -> bool:
    """Whether the process group is bound to this rank's CUDA device when it is created (``device_id``), as
    DeepSpeed's own initialisation does: on CUDA, except with torch between 2.6.0 and 2.7.1 (exclusive), where a
    bound device could hang (pytorch/pytorch#153960)."""
    from packaging.version import Version

    return device.type == "cuda" and not Version("2.6.0") < Version(torch.__version__) < Version("2.7.1")


def init_agent_process_group(cfg: TrainConfig, agent: AgentConfig, rank: int, world_size: int,
                             master_addr: str | None, master_port: int | None, device: torch.device,
                             store: torch.distributed.TCPStore | None = None) -> None:
    """Join (or create) the agent's process group; a process already in a group of another size is an error.

    The group meets on rank 0's TCP store: rank 0 passes ``store`` (:func:`listening_store`, started when the
    rendezvous was announced) or, with no port given, starts one here; every other rank connects to
    ``master_addr:master_port``. ``torch.distributed`` is initialised on that store with DeepSpeed's timeout (and,
    on GPUs, this rank's CUDA device, :func:`binds_cuda_device`), and DeepSpeed takes the group as it
    is (``deepspeed.init_distributed`` on an initialised group).
    """
    import deepspeed
    from deepspeed.constants import default_pg_timeout

    if torch.distributed.is_initialized():
        if torch.distributed.get_world_size() != world_size:
            raise RuntimeError(
                f"agent {agent.name!r}: this process already belongs to a process group of size "
                f"{torch.distributed.get_world_size()}, expected {world_size}")
        return
    address = master_addr or cfg.cluster.bind_host
    if store is None:
        if master_port is None and rank != 0:
            raise ValueError(f"agent {agent.name!r}: rank {rank} needs the port of rank 0's store (master_port)")
        store = (listening_store(address, world_size) if master_port is None else
                 torch.distributed.TCPStore(address, master_port, world_size, is_master=rank == 0,
                                            wait_for_workers=False, timeout=default_pg_timeout))
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(store.port)
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo's pair connections leave through this rank's own address: loopback when the group meets on loopback
        # (every rank on this machine), else this worker's node address (other ranks may sit on other nodes)
        own_address = address
        if not is_loopback(own_address):
            import ray

            own_address = ray.util.get_node_ip_address() if ray.is_initialized() else own_address
        interface = gloo_interface(own_address, host_interfaces())
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(torch.cuda.current_device() if device.type == "cuda" else 0)
    backend = "nccl" if device.type == "cuda" else "gloo"
    use_interpreter_ninja()  # DeepSpeed builds (or finds built) its CPU collective op here
    extra = {"device_id": torch.device("cuda", torch.cuda.current_device())} if binds_cuda_device(device) else {}
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                         timeout=default_pg_timeout, **extra)
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)


class EngineStateSleep:
    """Moves a DeepSpeed engine's states off the device and back (``deepspeed_enable_sleep``).

    :meth:`sleep` calls ``engine.offload_states()`` (bf16/fp32 model weights, gradients, fp32 master weights and Adam
    moments to pinned CPU memory; with ``adam_offload`` DeepSpeed leaves out what is already on the CPU) and
    :meth:`wake` ``engine.reload_states()``. Both are idempotent, and no-ops when ``enabled`` is False. ZeRO-1/2
    only: DeepSpeed's ZeRO-3 ``offload_states`` accepts only its CUDA ``FusedAdam``, which has no exact skip, so the
    configuration refuses ``deepspeed_enable_sleep`` with ZeRO-3 (and with ZeRO-0, which has no ZeRO optimizer to
    move the states). On the CPU the states stay where they are, but the calls run.
    """

    def __init__(self, engine: Any, enabled: bool) -> None:
        self.engine = engine
        self.enabled = bool(enabled)
        self.asleep = False

    def sleep(self) -> None:
        if not self.enabled or self.asleep:
            return
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

        self.engine.offload_states(device=OffloadDeviceEnum.cpu, pin_memory=True)
        self.asleep = True

    def wake(self) -> None:
        if not self.asleep:
            return
        self.engine.reload_states()
        self.asleep = False


@dataclass
class TrainingParts:
    """What one rank trains with (a record, not an engine): the DeepSpeed engine, the HF model inside it, the optimizer
    DeepSpeed wraps and the learning-rate schedule."""

    engine: Any
    model: torch.nn.Module
    client_optimizer: SkippableOptimizer
    scheduler: Any
    hf_ds_config: Any = None
    """ZeRO-3: transformers' handle that partitions weights while loading (kept alive with the engine)."""
    states: EngineStateSleep | None = None
    """Moves the engine's states off the device and back (``deepspeed_enable_sleep``; no-ops when off)."""


def build_policy_engine(cfg: TrainConfig, agent: AgentConfig, lora: LoraPlan, total_updates: int) -> TrainingParts:
    """Load the agent's model, add its plan's LoRA adapter (``lora``, :attr:`~openrlhf_hacpo.actors.agent_plan.
    AgentPlan.lora`; rank 0: none) and wrap it in DeepSpeed (ZeRO-3 partitions it while loading)."""
    import deepspeed
    from transformers import AutoModelForCausalLM

    from openrlhf_hacpo.actors.lora import apply_lora

    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    gloo = torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"
    ds_config = build_ds_config(cfg, agent, gloo=gloo)
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
    if hf_ds_config is not None and not cfg.cluster.use_ray:
        # several agents share this process: ZeRO-3 partitioning must not leak into the next agent's load
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    if agent.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model = apply_lora(model, lora, agent.name)  # rank > 0: a peft model whose adapter alone requires gradients
    optimizer = build_optimizer(_grouped_parameters(model, cfg.optim.l2), agent, agent.learning_rate,
                                tuple(cfg.optim.adam_betas))
    scheduler = SkipAwareScheduler(_lr_scheduler(cfg, optimizer, total_updates), optimizer)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=ds_config, dist_init_required=False)
    return TrainingParts(engine=engine, model=engine.module, client_optimizer=optimizer, scheduler=scheduler,
                         hf_ds_config=hf_ds_config, states=EngineStateSleep(engine, agent.deepspeed_enable_sleep))
