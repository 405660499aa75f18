"""One agent's layout, planned once: :class:`AgentPlan`, what the driver decides about an agent's workers before any
of them starts, and :func:`plan_agents`, which plans every agent of a run from its
:class:`~openrlhf_hacpo.config.TrainConfig` (inherited settings resolved by ``TrainConfig.resolved_agents``).

The driver plans once (``trainer/controller.py``: after it knows whether the run is on GPUs; the node of each bundle
is added by :func:`~openrlhf_hacpo.trainer.preflight.check_node_placement` on a multi-node cluster) and hands the
plans on; nothing downstream derives a layout again:

* the node planner places :attr:`AgentPlan.demand` (:mod:`openrlhf_hacpo.engines.node_plan`), the GPU count check
  adds the demands up (:func:`~openrlhf_hacpo.trainer.preflight.gpu_demand`);
* the memory plan reads an agent's parallelism, engines, LoRA and offload settings from its plan
  (:func:`~openrlhf_hacpo.trainer.memory_layout.agent_layouts`);
* :class:`~openrlhf_hacpo.actors.agent_group.AgentGroup` launches the workers where the plan says
  (:mod:`openrlhf_hacpo.actors.agent_launch`), and every policy worker receives the plan (its LoRA adapter and where
  its reference log-probs come from).

The decisions, each made here only:

* **a reference model of its own** (:attr:`AgentPlan.has_reference`, by :func:`owns_reference_model`): when the loss
  has a KL term and the agent trains no LoRA adapter. A LoRA agent's reference is its own model with the adapter
  switched off (:attr:`AgentPlan.adapter_reference`), so no second copy of the weights is launched or counted;
* **colocation** (:attr:`AgentPlan.colocated`): ``--colocate_all_models`` with vLLM engines on GPUs (CPU engines and
  the ``hf_engine`` actor always have their own processes);
* **bundles**: ``dp`` policy bundles, or max(dp, engines × TP) when colocated, plus engines × TP dedicated engine
  bundles (:class:`~openrlhf_hacpo.engines.node_plan.AgentDemand` holds the formula); on GPUs a bundle is a GPU, on a
  CPU-only cluster a CPU bundle, taken only when the workers are pinned to nodes;
* **GPU shares** (:attr:`AgentPlan.policy_gpus`): the policy rank, the reference (bundle 0) and colocated engines
  split a bundle's GPU evenly among those present;
* **engine settings** (:attr:`AgentPlan.engine_settings`, vLLM only): :func:`~openrlhf_hacpo.engines.settings.
  resolve_engine_settings` for the device and colocation;
* **weight-sync path** (:attr:`AgentPlan.weight_sync_mode`): NCCL broadcast to dedicated GPU engines; CUDA IPC to
  colocated ones when every engine GPU holds a policy rank; the object store else;
* **CPU cores**: CPU vLLM engines' core ranges (:meth:`AgentPlan.cpu_core_binds`) and the ``hf_engine`` layout's
  per-process share (:meth:`AgentPlan.core_share`), both from every agent's counts.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from openrlhf_hacpo.config import ENGINE_BACKENDS, TrainConfig
from openrlhf_hacpo.engines.node_plan import AgentDemand, AgentPlacement
from openrlhf_hacpo.engines.settings import CoreShare, EngineSettings, resolve_engine_settings

__all__ = ["AgentPlan", "LoraPlan", "owns_reference_model", "plan_agents", "with_nodes"]


def owns_reference_model(kl: bool, lora_rank: int) -> bool:
    """Whether an agent has a reference model of its own (a second copy of ``pretrain``, a
    :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker`): when the loss has a KL term (``kl``) and the agent
    trains no LoRA adapter (``lora_rank`` 0); a LoRA agent's reference is its base model, the adapter switched off.

    The one rule; :attr:`AgentPlan.has_reference` applies it to a plan and the memory plan's what-if layouts
    (:attr:`~openrlhf_hacpo.trainer.memory_layout.AgentLayout.has_reference`) to theirs."""
    return bool(kl) and int(lora_rank) <= 0


@dataclass(frozen=True)
class LoraPlan:
    """An agent's LoRA adapter (``lora_rank`` 0: full-parameter training, no adapter)."""

    rank: int = 0
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str = "all-linear"

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class AgentPlan:
    """One agent's layout, as the driver planned it (see the module docstring for the rules).

    Attributes:
        name / index: the agent's name and its index in ``cfg.agents``.
        dp: data-parallel policy ranks.
        backend: the run's rollout backend (``hf``, ``hf_engine``, ``vllm``).
        vllm_engines / tp: vLLM engines (0 without the ``vllm`` backend) and GPUs (CPU shards) per engine.
        on_gpu: the workers run on GPUs.
        colocate: ``--colocate_all_models`` as given (:attr:`colocated` says whether it applies).
        kl: the loss has a KL term (``--init_kl_coef`` > 0).
        lora: the LoRA adapter.
        adam_offload / param_offload / deepspeed_enable_sleep / ref_reward_offload: where states live.
        engine_settings: the vLLM engines' memory, graph and sleep settings (None without vLLM engines).
        engine_dtype: the engines' precision, ``float32`` or ``bfloat16`` (``AgentConfig.resolved_engine_dtype``).
        node: the node the agent is pinned to (``node=``), or None.
        nodes: the node of each bundle, on a multi-node cluster (None: Ray packs the bundles).
        run_dp / run_vllm_engines: every agent's ``dp`` and ``vllm_engines``, in agent order (core splits).
    """

    name: str
    index: int
    dp: int
    backend: str = "hf"
    vllm_engines: int = 0
    tp: int = 1
    on_gpu: bool = False
    colocate: bool = False
    kl: bool = False
    lora: LoraPlan = LoraPlan()
    adam_offload: bool = False
    param_offload: bool = False
    deepspeed_enable_sleep: bool = False
    ref_reward_offload: bool = False
    engine_settings: EngineSettings | None = None
    engine_dtype: str = "float32"
    node: str | None = None
    nodes: AgentPlacement | None = None
    run_dp: tuple[int, ...] = ()
    run_vllm_engines: tuple[int, ...] = ()

    # ------------------------------------------------------------------------------------------------ workers
    @property
    def has_reference(self) -> bool:
        """A reference worker of its own is launched (and counted by the memory plan): :func:`owns_reference_model`."""
        return owns_reference_model(self.kl, self.lora.rank)

    @property
    def adapter_reference(self) -> bool:
        """The KL term's reference is the policy's own model with its LoRA adapter switched off (on the policy
        ranks, :class:`~openrlhf_hacpo.actors.lora.AdapterDisabledReference`)."""
        return self.kl and not self.has_reference

    @property
    def has_engines(self) -> bool:
        """The agent generates in engine actors of its own (``vllm``, ``hf_engine``), synced after every update."""
        return self.backend in ENGINE_BACKENDS

    @property
    def engine_role(self) -> str:
        """What the agent's engines are called in errors: ``HF engine`` or ``vLLM engine``."""
        return "HF engine" if self.backend == "hf_engine" else "vLLM engine"

    @property
    def colocated(self) -> bool:
        """vLLM engines share the policy's GPUs (``--colocate_all_models``, ``vllm`` backend, GPUs)."""
        return self.colocate and self.backend == "vllm" and self.on_gpu

    # ------------------------------------------------------------------------------------------------ bundles
    @property
    def demand(self) -> AgentDemand:
        """The agent's bundles as the node planner takes them."""
        return AgentDemand(agent=self.name, dp=self.dp, engines=self.vllm_engines, tp=self.tp,
                           colocated=self.colocated, reference=self.has_reference, node=self.node)

    @property
    def policy_bundles(self) -> int:
        """Bundles of the policy's placement group: ``dp``, or max(dp, engines × TP) when colocated."""
        return self.demand.policy_bundles

    @property
    def engine_bundles(self) -> int:
        """Bundles of the dedicated engines: engines × TP (0 when colocated or without vLLM engines)."""
        return self.demand.engine_bundles

    @property
    def bundle_kind(self) -> str:
        """``GPU`` on GPUs, ``CPU`` on a CPU-only cluster."""
        return "GPU" if self.on_gpu else "CPU"

    @property
    def takes_bundles(self) -> bool:
        """The workers sit in placement groups: always on GPUs; on CPUs only when the plan pins them to nodes (else
        they ask for nothing and Ray starts them on the driver's node)."""
        return self.on_gpu or self.nodes is not None

    @property
    def policy_gpus(self) -> float:
        """GPU share of a policy rank and of the reference: the bundle's GPU split evenly among the policy, the
        reference (when present) and colocated engines; 0 off GPUs."""
        if not self.on_gpu:
            return 0.0
        shares = 1 + int(self.has_reference) + int(self.colocated)
        return 1.0 / shares if shares > 1 else 1.0

    @property
    def weight_sync_mode(self) -> str:
        """How weights reach the engines: NCCL broadcast to dedicated GPU engines; CUDA IPC to colocated ones when
        every engine GPU holds a policy rank (NCCL cannot link two processes on one GPU); the object store else."""
        if not self.on_gpu:
            return "object_store"
        if not self.colocate:
            return "broadcast"
        return "cuda_ipc" if self.dp >= self.vllm_engines * self.tp else "object_store"

    # ------------------------------------------------------------------------------------------------ CPU cores
    def cpu_core_binds(self, available_cores: Sequence[int]) -> list[str]:
        """This agent's share of ``available_cores`` for its CPU vLLM engines: every engine of every agent gets its
        own cores, agents before this one taking the first ranges
        (:func:`~openrlhf_hacpo.engines.placement.spread_cpu_cores`)."""
        from openrlhf_hacpo.engines.placement import spread_cpu_cores

        counts = self.run_vllm_engines
        binds = spread_cpu_cores(sum(counts), sorted(available_cores))
        offset = sum(counts[:self.index])
        return binds[offset:offset + counts[self.index]]

    def core_share(self, process: int) -> CoreShare:
        """``hf_engine``: the share of its node's cores of this agent's process ``process`` (policy ranks, then the
        engine; :func:`~openrlhf_hacpo.engines.settings.split_cpu_cores`)."""
        return CoreShare(tuple(dp + 1 for dp in self.run_dp), self.index, process)


def plan_agents(cfg: TrainConfig, on_gpu: bool) -> list[AgentPlan]:
    """Every agent's :class:`AgentPlan` (no nodes yet: :func:`with_nodes`) for a run on GPUs (``on_gpu``) or CPUs.

    Raises ``ValueError`` for a layout no worker could start in: ``hf_engine`` on GPUs (its engine runs on CPU
    cores), and the engine settings :func:`~openrlhf_hacpo.engines.settings.resolve_engine_settings` refuses (sleep
    mode on CPU engines)."""
    agents, backend = cfg.resolved_agents, cfg.rollout.rollout_backend
    vllm = backend == "vllm"
    if on_gpu and backend == "hf_engine":
        raise ValueError(f"agent {agents[0].name!r}: --rollout_backend hf_engine runs its engine on CPU cores; on GPUs "
                         "use --rollout_backend vllm (engine actors on GPUs) or hf (generate on the policy's GPU)")
    engines = tuple(a.vllm_num_engines if vllm else 0 for a in agents)
    settings = None
    if vllm:
        engine = cfg.engines
        settings = resolve_engine_settings(on_gpu, on_gpu and engine.colocate_all_models, engine.vllm_enforce_eager,
                                           engine.vllm_gpu_memory_utilization, engine.vllm_enable_sleep)
    return [AgentPlan(
        name=agent.name, index=index, dp=agent.dp_size, backend=backend, vllm_engines=engines[index],
        tp=agent.vllm_tensor_parallel_size, on_gpu=on_gpu, colocate=cfg.engines.colocate_all_models,
        kl=cfg.algo.loss.uses_kl,
        lora=LoraPlan(rank=int(agent.lora_rank or 0), alpha=agent.lora_alpha, dropout=agent.lora_dropout,
                      target_modules=agent.target_modules),
        adam_offload=bool(agent.adam_offload), param_offload=bool(agent.param_offload),
        deepspeed_enable_sleep=bool(agent.deepspeed_enable_sleep), ref_reward_offload=bool(agent.ref_reward_offload),
        engine_settings=settings, engine_dtype=agent.resolved_engine_dtype, node=agent.node, run_dp=tuple(a.dp_size for a in agents),
        run_vllm_engines=engines) for index, agent in enumerate(agents)]


def with_nodes(plans: Sequence[AgentPlan], placements: Sequence[AgentPlacement] | None) -> list[AgentPlan]:
    """``plans`` with the node of every bundle (``placements`` in the same order, from
    :func:`~openrlhf_hacpo.engines.node_plan.plan_nodes`); unchanged for None (Ray packs the bundles)."""
    if placements is None:
        return list(plans)
    if [p.agent for p in placements] != [p.name for p in plans]:
        raise ValueError(f"placements for {[p.agent for p in placements]}, plans for {[p.name for p in plans]}")
    return [replace(plan, nodes=placement) for plan, placement in zip(plans, placements)]
