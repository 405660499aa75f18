"""Starting one agent's workers where its plan puts them: :class:`AgentLaunch` creates the policy ranks, the
reference worker and the engines of an :class:`~openrlhf_hacpo.actors.agent_group.AgentGroup` and holds their
placement groups until shutdown; :func:`worker_locations` and :func:`worker_node_labels` say where they landed.

Nothing here decides a layout: the bundles, their nodes, the GPU shares, whether a reference worker exists, the
engine settings and the CPU cores all come from the agent's :class:`~openrlhf_hacpo.actors.agent_plan.AgentPlan`.

* Without Ray one plain :class:`~openrlhf_hacpo.actors.policy.PolicyWorker` (and reference) runs in the driver.
* With Ray the policy (and, colocated, the engines) take :attr:`AgentPlan.policy_bundles` bundles of the plan's
  kind, pinned to the plan's nodes when it has them; rank r sits on bundle r, the reference on bundle 0. Ranks
  rendezvous on rank 0's address (dp > 1). Colocated engines start once the policies hold their GPU memory, so
  vLLM sizes its cache to what is left; dedicated engines start at once, in a placement group of their own when the
  plan pins them to nodes.
"""
from __future__ import annotations

from typing import Any

from openrlhf_hacpo.actors.pending import Pending
from openrlhf_hacpo.actors.policy import PolicyWorker
from openrlhf_hacpo.actors.results import WorkerInfo

__all__ = ["AgentLaunch", "worker_locations", "worker_node_labels"]


class AgentLaunch:
    """The launch of one agent's workers (``group``: its :class:`~openrlhf_hacpo.actors.agent_group.AgentGroup`,
    whose ``policies``, ``reference``, ``engines`` and ``rendezvous`` it fills) and its placement groups."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.policy_group: Any = None  # the policy's placement group (and colocated engines')
        self.engine_group: Any = None  # the dedicated engines' placement group, when pinned to nodes

    def start(self) -> Pending:
        """Create the workers and start their setup (model loading, DeepSpeed init)."""
        return self._ray() if self.group.use_ray else self._local()

    def _reference_kwargs(self) -> dict[str, Any]:
        group = self.group
        agent, cfg = group.agent, group.cfg
        return dict(bf16=agent.bf16, attn_implementation=agent.attn_implementation,
                    micro_batch_size=cfg.train.micro_train_batch_size, logprob_path=cfg.compute.logprob_path,
                    kernel_backend=cfg.compute.kernel_backend, device=cfg.cluster.device,
                    offload=group.plan.ref_reward_offload)

    def _local(self) -> Pending:
        from openrlhf_hacpo.actors.reference import ReferenceWorker

        group = self.group
        policy = PolicyWorker(group.cfg, group.plan, total_updates=group.total_updates)
        info = policy.setup()
        group.policies = [policy]
        if group.plan.has_reference:
            group.reference = ReferenceWorker(group.agent.pretrain, pad_token_id=policy.pad_token_id,
                                              **self._reference_kwargs())
            group.reference.setup()
            policy.set_reference(group.reference)
        return Pending(group, "policy", [info], list, remote=False)

    def _ray(self) -> Pending:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from openrlhf_hacpo.actors.policy import policy_actor_class
        from openrlhf_hacpo.actors.reference import reference_actor_class
        from openrlhf_hacpo.engines.placement import bundle_group, wait_placement_group
        from openrlhf_hacpo.utils.network import driver_started_ray

        group, plan = self.group, self.group.plan
        dp = plan.dp
        strategies: list[dict[str, Any]] = [{} for _ in range(dp)]
        ref_options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0}
        if plan.takes_bundles:
            bundles, kind = plan.policy_bundles, plan.bundle_kind
            nodes = plan.nodes.policy if plan.nodes is not None else None
            self.policy_group = bundle_group(bundles, nodes, kind)
            try:
                wait_placement_group(self.policy_group, group.placement_timeout_s,
                                     f"agent {group.name!r}: {bundles} {kind} bundle(s) for its policy"
                                     + (" and colocated engines" if bundles > dp else ""), kind)
            except TimeoutError:
                self.policy_group = None  # removed by the wait; shutdown has nothing left to remove
                raise
            strategies = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.policy_group, placement_group_bundle_index=r)} for r in range(dp)]
            ref_options = {"num_cpus": 0, "num_gpus": plan.policy_gpus, "scheduling_strategy":
                           PlacementGroupSchedulingStrategy(placement_group=self.policy_group,
                                                            placement_group_bundle_index=0)}
        group.policies = [policy_actor_class().options(num_cpus=0, num_gpus=plan.policy_gpus, **strategies[r]).remote(
            group.cfg, plan, r, dp, None, None, group.total_updates) for r in range(dp)]
        started_local_ray = group.started_local_ray if group.started_local_ray is not None else driver_started_ray()
        addr, port = (group.call(group.policies[:1], PolicyWorker.get_master_addr_port, [(started_local_ray,)],
                                 "policy", lambda v: v[0]).result()
                      if dp > 1 else (None, None))
        group.rendezvous = (addr, port) if addr is not None else None
        refs = [p.setup.remote(addr, port) for p in group.policies]
        if plan.has_reference:
            group.reference = reference_actor_class().options(**ref_options).remote(
                group.agent.pretrain, pad_token_id=0, **self._reference_kwargs())
            refs.append(group.reference.setup.remote())
        # colocated engines start once the policies hold their GPU memory, so vLLM sizes its cache to what is left
        if plan.has_engines and not plan.colocated:
            self.create_engines()
        n_policy = len(group.policies)

        def combine(values: list[Any]) -> list[WorkerInfo]:
            if group.reference is not None:
                group.call(group.policies, PolicyWorker.set_reference, [(group.reference,)] * n_policy, "policy",
                           lambda v: v).result()
            if plan.has_engines and plan.colocated:
                self.create_engines()
            if plan.backend == "hf_engine":
                self._hf_engines_ready()
            return values[:n_policy]

        return Pending(group, "policy", refs, combine, remote=True, method="setup",
                       workers=[*group.policies, *([group.reference] if group.reference is not None else [])])

    # ------------------------------------------------------------------------------------------------ engines
    def create_engines(self) -> None:
        """The agent's engine actors: its vLLM engines (the plan's count, TP size and settings; colocated ones in the
        policy's placement group, pinned ones in their own) or its one HF engine."""
        if self.group.plan.backend == "hf_engine":
            self._create_hf_engine()
            return
        from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines

        group = self.group
        plan, cfg, settings = group.plan, group.cfg, group.plan.engine_settings
        kwargs: dict[str, Any] = dict(
            dtype=plan.engine_dtype,
            enforce_eager=settings.enforce_eager,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enable_sleep_mode=settings.enable_sleep_mode,
        )
        if plan.colocated:
            kwargs["shared_placement_group"] = self.policy_group
        elif plan.nodes is not None:
            kwargs["engine_placement_group"] = self._pinned_engine_group()
        if not plan.on_gpu:
            import os

            kwargs["cpu_omp_threads_binds"] = plan.cpu_core_binds(os.sched_getaffinity(0))
            kwargs["single_process"] = cfg.engines.vllm_cpu_single_process
        group.engines = create_vllm_engines(
            plan.vllm_engines, plan.tp, group.agent.pretrain,
            seed=cfg.train.seed + 1000 * plan.index,
            # room for the longest response asked for: rollouts or (possibly longer) evaluation responses
            max_model_len=cfg.prompts.prompt_max_len + max(cfg.prompts.generate_max_len,
                                                           cfg.eval.eval_generate_max_len or 0),
            use_gpu=plan.on_gpu, num_cpus_per_engine=0.0, placement_timeout_s=group.placement_timeout_s,
            name_prefix=None, **kwargs)
        group.rollouts.engines_created()

    def _pinned_engine_group(self):
        """The dedicated engines' placement group, each bundle on the node the plan gives it."""
        from openrlhf_hacpo.engines.placement import bundle_group, wait_placement_group

        group, plan = self.group, self.group.plan
        kind = plan.bundle_kind
        self.engine_group = bundle_group(len(plan.nodes.engines), plan.nodes.engines, kind)
        try:
            wait_placement_group(self.engine_group, group.placement_timeout_s,
                                 f"agent {group.name!r}: {plan.vllm_engines} engine(s) x TP {plan.tp} {kind}s", kind)
        except TimeoutError:
            self.engine_group = None  # removed by the wait
            raise
        return self.engine_group

    def _create_hf_engine(self) -> None:
        """``hf_engine``: one :class:`~openrlhf_hacpo.engines.hf_engine.HFEngine` actor beside the policy, in the
        policy's placement group when it has one (on rank 0's node), with the last share of the agent's cores
        (:meth:`AgentPlan.core_share`); its model loads while the policies set up (:meth:`_hf_engines_ready` waits
        for it)."""
        from openrlhf_hacpo.engines.hf_engine import create_hf_engine

        group, plan = self.group, self.group.plan
        strategy = None
        if self.policy_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            strategy = PlacementGroupSchedulingStrategy(placement_group=self.policy_group,
                                                        placement_group_bundle_index=0)
        group.engines = [create_hf_engine(group.agent, plan.engine_dtype, seed=group.cfg.train.seed + 1000 * plan.index,
                                          core_share=plan.core_share(plan.dp), scheduling_strategy=strategy)]

    def _hf_engines_ready(self) -> None:
        """Wait until the engines have loaded their models, then pin each policy rank to its share of the cores
        (the policies have set up: the threads DeepSpeed started are pinned with them)."""
        import ray

        from openrlhf_hacpo.engines.hf_engine import HFEngine

        group = self.group
        group.call(group.engines, HFEngine.ready, [()] * len(group.engines), group.plan.engine_role,
                   lambda v: v).result()
        ray.get([policy.__ray_call__.remote(_bind_policy_cores, group.plan.core_share(rank))
                 for rank, policy in enumerate(group.policies)], timeout=group.timeout_s)

    def remove_placement_groups(self) -> None:
        """Give the agent's placement groups back to Ray (a no-op for those never made or already removed)."""
        from ray.util.placement_group import remove_placement_group

        for placement_group in (self.policy_group, self.engine_group):
            if placement_group is not None:
                remove_placement_group(placement_group)
        self.policy_group = self.engine_group = None


def worker_locations(group: Any) -> dict[str, Any]:
    """Where ``group``'s workers landed: per policy rank, for the reference and per engine actor its node id, node
    address and GPU ids (a TP engine's actor holds no GPU: its shards sit on the bundles listed under
    ``planned_nodes``), and ``rendezvous``, the address and port its DeepSpeed group met on (None for one rank);
    empty without Ray."""
    if not group.use_ray:
        return {}
    from openrlhf_hacpo.engines.placement import actor_locations

    found = actor_locations(group.actors(), timeout_s=group.timeout_s)
    policy, rest = found[:len(group.policies)], found[len(group.policies):]
    out: dict[str, Any] = {"policy": [{"rank": r, **where} for r, where in enumerate(policy)]}
    if group.reference is not None:
        out["reference"], rest = rest[0], rest[1:]
    out["engines"] = [{"engine": i, **where} for i, where in enumerate(rest)]
    plan = group.plan
    if plan.nodes is not None and not plan.colocated:
        for i, entry in enumerate(out["engines"]):
            entry["planned_nodes"] = list(plan.nodes.engine_nodes(i))
    out["rendezvous"] = ({"address": group.rendezvous[0], "port": group.rendezvous[1]}
                         if group.rendezvous is not None else None)
    return out


def worker_node_labels(group: Any, locations: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """Actor id (hex) -> how errors name its node, for every worker of ``group`` (``locations`` as
    :func:`worker_locations` gives them; ``labels``: node id -> how errors name the node)."""
    entries = [*locations.get("policy", []), *([locations["reference"]] if locations.get("reference") else []),
               *locations.get("engines", [])]
    out = {}
    for actor, entry in zip(group.actors(), entries):
        actor_id = getattr(actor, "_actor_id", None)
        if actor_id is not None:
            out[actor_id.hex()] = labels.get(entry["node_id"], entry.get("address", "?"))
    return out


def _bind_policy_cores(_worker: Any, share: Any) -> list[int] | None:
    """Run inside a policy actor (``__ray_call__``): pin it to its share of its node's cores (``hf_engine``)."""
    from openrlhf_hacpo.engines.hf_engine import bind_to_share

    return bind_to_share(share)
