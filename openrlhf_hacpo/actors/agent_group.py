"""Everything one agent is, behind one handle: its policy workers, its reference worker and its rollout engines.

The controller talks to an agent only through its :class:`AgentGroup`. With Ray (the default) the workers are
actors: ``dp_size`` :class:`~openrlhf_hacpo.actors.policy.PolicyWorker` ranks (Ray actors) forming the agent's own
``torch.distributed`` group, an optional :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker` (when the KL
coefficient is positive) and its rollout engines: ``vllm_num_engines`` vLLM engine actors for the ``vllm``
backend, one :class:`~openrlhf_hacpo.engines.hf_engine.HFEngine` actor (transformers ``generate``) for ``hf_engine``,
none for ``hf`` (the policy generates). Without Ray
(``use_ray=False``) one plain :class:`~openrlhf_hacpo.actors.policy.PolicyWorker` runs in the driver process.

Methods that start work on the workers return a :class:`Pending`; ``Pending.result()`` waits for it and gives one
typed value (:mod:`openrlhf_hacpo.actors.results`). Starting the same phase on every agent before waiting on any makes
the agents work concurrently; an engine rollout starts generation and scoring at once (the scoring waits for the
engines' outputs inside Ray), so its pending is one level too. A worker that dies surfaces as
:class:`AgentWorkerDied` naming the agent; a wait longer than ``--step_timeout`` (a hung or stopped worker) surfaces as
:class:`AgentPhaseTimeout` naming the agent, the worker and the phase.
"""
from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from openrlhf_hacpo.actors.pending import (AgentPhaseTimeout, AgentWorkerDied, Pending, WorkerRef, death_error,
                                           is_actor_death, phase_of)
from openrlhf_hacpo.actors.policy import PolicyWorker
from openrlhf_hacpo.actors.results import RolloutResult, TrainStepResult, WorkerInfo
from openrlhf_hacpo.actors.scoring import mismatch_sampling
from openrlhf_hacpo.algorithms import CapabilityRatios
from openrlhf_hacpo.actors.sharding import reindex, shard_sampling, split_shards
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.utils.timing import PhaseTimer

__all__ = ["AgentGroup", "AgentPhaseTimeout", "AgentWorkerDied", "Pending"]



class AgentGroup:
    """One agent's workers.

    Args:
        cfg: the run configuration.
        agent_index: this agent's index in ``cfg.agents``.
        total_updates: optimizer updates of the whole run (learning-rate schedule).
        use_gpu: place workers on GPUs (placement groups) instead of CPU processes.
        node_placement: the node of each of the agent's bundles, GPU bundles or, on a CPU-only cluster, CPU bundles
            (:func:`~openrlhf_hacpo.engines.node_plan.plan_nodes`); None lets Ray pack them (a one-node cluster).
        started_local_ray: the driver started its own local Ray (the group then meets on ``--bind_host``); None
            asks Ray (:func:`~openrlhf_hacpo.utils.network.driver_started_ray`).
    """

    def __init__(self, cfg: TrainConfig, agent_index: int, total_updates: int, use_gpu: bool = False,
                 node_placement: Any = None, started_local_ray: bool | None = None) -> None:
        self.cfg = cfg
        self.index = agent_index
        self.agent: AgentConfig = cfg.resolved_agents()[agent_index]
        self.name = self.agent.name
        self.total_updates = total_updates
        self.use_gpu = use_gpu
        self.use_ray = cfg.use_ray
        self.timeout_s: float | None = cfg.step_timeout
        # a LoRA agent's reference is its own model with the adapter off, on the policy workers
        self.needs_reference = cfg.algo.loss.uses_kl and not self.agent.lora_rank
        self.policies: list[Any] = []
        self.reference: Any = None
        self.engines: list[Any] = []
        self._placement_group = None
        self._engine_placement_group = None
        self.node_placement = node_placement
        self.started_local_ray = started_local_ray
        self.rendezvous: tuple[str, int] | None = None  # where the agent's DeepSpeed group met (dp > 1)
        # actor id (hex) -> the node it runs on, for error messages (:meth:`record_nodes`)
        self.worker_nodes: dict[str, str] = {}
        self._broadcast_ready = False
        self._engines_sleep = False
        self._engines_awake = False
        # weights versions (training steps taken): the learner's (set by the controller after each step and on
        # resume), and the one its engines hold since the last sync; every rollout stamps its trajectories with the
        # version that generated them (Trajectory.policy_version)
        self.policy_version = 0
        self.engine_version = 0

    placement_timeout_s: float = 300.0
    """How long to wait for Ray to place a placement group before failing with the GPU counts."""

    # ------------------------------------------------------------------------------------------------ launch
    def launch(self) -> Pending:
        """Create the workers and start their setup (model loading, DeepSpeed init)."""
        if not self.use_ray:
            return self._launch_local()
        return self._launch_ray()

    def _launch_local(self) -> Pending:
        from openrlhf_hacpo.actors.policy import PolicyWorker
        from openrlhf_hacpo.actors.reference import ReferenceWorker

        policy = PolicyWorker(self.cfg, self.index, total_updates=self.total_updates)
        info = policy.setup()
        self.policies = [policy]
        if self.needs_reference:
            self.reference = ReferenceWorker(self.agent.pretrain, bf16=self.agent.bf16,
                                             attn_implementation=self.agent.attn_implementation,
                                             pad_token_id=policy.pad_token_id,
                                             micro_batch_size=self.cfg.micro_train_batch_size,
                                             logprob_path=self.cfg.logprob_path,
                                             kernel_backend=self.cfg.kernel_backend, device=self.cfg.device,
                                             offload=self.agent.ref_reward_offload)
            self.reference.setup()
            policy.set_reference(self.reference)
        return Pending(self, "policy", [info], list, remote=False)

    def _launch_ray(self) -> Pending:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from openrlhf_hacpo.actors.policy import policy_actor_class
        from openrlhf_hacpo.actors.reference import reference_actor_class
        from openrlhf_hacpo.engines.placement import bundle_group, wait_placement_group
        from openrlhf_hacpo.utils.network import driver_started_ray

        dp = self.agent.dp_size
        colocate = self.cfg.colocate_all_models
        strategies: list[dict[str, Any]] = [{} for _ in range(dp)]
        ref_options: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0}
        policy_gpus = 0.0
        # GPU runs always take GPU bundles; CPU-only runs take CPU bundles when the plan pins them to nodes (a
        # multi-node cluster), else their workers ask for nothing and Ray starts them on the driver's node
        if self.use_gpu or self.node_placement is not None:
            kind = "GPU" if self.use_gpu else "CPU"
            bundles = dp
            if self.use_gpu and colocate and self.cfg.rollout_backend == "vllm":
                bundles = max(dp, self.agent.vllm_num_engines * self.agent.vllm_tensor_parallel_size)
            nodes = self.node_placement.policy if self.node_placement is not None else None
            self._placement_group = bundle_group(bundles, nodes, kind)
            try:
                wait_placement_group(self._placement_group, self.placement_timeout_s,
                                     f"agent {self.name!r}: {bundles} {kind} bundle(s) for its policy"
                                     + (" and colocated engines" if bundles > dp else ""), kind)
            except TimeoutError:
                self._placement_group = None  # removed by the wait; shutdown has nothing left to remove
                raise
            ref_gpus = 0.0
            if self.use_gpu:
                shares = 1 + int(self.needs_reference) + int(colocate and self.cfg.rollout_backend == "vllm")
                policy_gpus = ref_gpus = 1.0 / shares if shares > 1 else 1.0
            strategies = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=r)} for r in range(dp)]
            ref_options = {"num_cpus": 0, "num_gpus": ref_gpus, "scheduling_strategy":
                           PlacementGroupSchedulingStrategy(placement_group=self._placement_group,
                                                            placement_group_bundle_index=0)}
        self.policies = [policy_actor_class().options(num_cpus=0, num_gpus=policy_gpus, **strategies[r]).remote(
            self.cfg, self.index, r, dp, None, None, self.total_updates) for r in range(dp)]
        started_local_ray = self.started_local_ray if self.started_local_ray is not None else driver_started_ray()
        addr, port = (self._call(self.policies[:1], PolicyWorker.get_master_addr_port, [(started_local_ray,)],
                                 "policy", lambda v: v[0]).result()
                      if dp > 1 else (None, None))
        self.rendezvous = (addr, port) if addr is not None else None
        refs = [p.setup.remote(addr, port) for p in self.policies]
        if self.needs_reference:
            self.reference = reference_actor_class().options(**ref_options).remote(
                self.agent.pretrain, bf16=self.agent.bf16, attn_implementation=self.agent.attn_implementation,
                pad_token_id=0, micro_batch_size=self.cfg.micro_train_batch_size,
                logprob_path=self.cfg.logprob_path, kernel_backend=self.cfg.kernel_backend, device=self.cfg.device,
                offload=self.agent.ref_reward_offload)
            refs.append(self.reference.setup.remote())
        # colocated engines start once the policies hold their GPU memory, so vLLM sizes its cache to what is left
        engines_after_policies = self.use_gpu and colocate
        if self.has_engines and not engines_after_policies:
            self._create_engines()
        n_policy = len(self.policies)

        def combine(values: list[Any]) -> list[WorkerInfo]:
            if self.reference is not None:
                self._call(self.policies, PolicyWorker.set_reference, [(self.reference,)] * n_policy, "policy",
                           lambda v: v).result()
            if self.has_engines and engines_after_policies:
                self._create_engines()
            if self.cfg.rollout_backend == "hf_engine":
                self._hf_engines_ready()
            return values[:n_policy]

        return Pending(self, "policy", refs, combine, remote=True, method="setup",
                       workers=[*self.policies, *([self.reference] if self.reference is not None else [])])

    @property
    def has_engines(self) -> bool:
        """The agent generates in engine actors of its own (``vllm``, ``hf_engine``), synced after every update."""
        from openrlhf_hacpo.config import ENGINE_BACKENDS

        return self.cfg.rollout_backend in ENGINE_BACKENDS

    @property
    def engine_role(self) -> str:
        """What the agent's engines are called in errors: ``HF engine`` or ``vLLM engine``."""
        return "HF engine" if self.cfg.rollout_backend == "hf_engine" else "vLLM engine"

    def _create_engines(self) -> None:
        if self.cfg.rollout_backend == "hf_engine":
            self._create_hf_engine()
            return
        from openrlhf_hacpo.engines.settings import resolve_engine_settings
        from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines

        agent, cfg = self.agent, self.cfg
        colocated = self.use_gpu and cfg.colocate_all_models
        settings = resolve_engine_settings(self.use_gpu, colocated, cfg.vllm_enforce_eager,
                                           cfg.vllm_gpu_memory_utilization, cfg.vllm_enable_sleep)
        kwargs: dict[str, Any] = dict(
            dtype="bfloat16" if agent.bf16 else "float32",
            enforce_eager=settings.enforce_eager,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enable_sleep_mode=settings.enable_sleep_mode,
        )
        if colocated:
            kwargs["shared_placement_group"] = self._placement_group
        elif self.node_placement is not None:
            kwargs["engine_placement_group"] = self._pinned_engine_group()
        if not self.use_gpu:
            kwargs["cpu_omp_threads_binds"] = self._cpu_core_binds()
            kwargs["single_process"] = cfg.vllm_cpu_single_process
        self.engines = create_vllm_engines(
            agent.vllm_num_engines, agent.vllm_tensor_parallel_size, agent.pretrain,
            seed=cfg.seed + 1000 * self.index,
            # room for the longest response asked for: rollouts or (possibly longer) evaluation responses
            max_model_len=cfg.prompt_max_len + max(cfg.generate_max_len, cfg.eval_generate_max_len or 0),
            use_gpu=self.use_gpu, num_cpus_per_engine=0.0, placement_timeout_s=self.placement_timeout_s,
            name_prefix=None, **kwargs)
        self._engines_sleep = settings.enable_sleep_mode
        if self._engines_sleep:
            self._engines_call(_engine_class().sleep)

    def _pinned_engine_group(self):
        """The dedicated engines' placement group, each bundle on the node the plan gives it."""
        from openrlhf_hacpo.engines.placement import bundle_group, wait_placement_group

        agent = self.agent
        kind = "GPU" if self.use_gpu else "CPU"
        self._engine_placement_group = bundle_group(len(self.node_placement.engines), self.node_placement.engines,
                                                    kind)
        try:
            wait_placement_group(self._engine_placement_group, self.placement_timeout_s,
                                 f"agent {self.name!r}: {agent.vllm_num_engines} engine(s) x TP "
                                 f"{agent.vllm_tensor_parallel_size} {kind}s", kind)
        except TimeoutError:
            self._engine_placement_group = None  # removed by the wait
            raise
        return self._engine_placement_group

    def locations(self) -> dict[str, Any]:
        """Where this agent's workers landed: per policy rank, for the reference and per engine actor its node id,
        node address and GPU ids (a TP engine's actor holds no GPU: its shards sit on the bundles listed under
        ``planned_nodes``), and ``rendezvous``, the address and port its DeepSpeed group met on (None for one rank);
        empty without Ray."""
        if not self.use_ray:
            return {}
        from openrlhf_hacpo.engines.placement import actor_locations

        actors = [*self.policies, *([self.reference] if self.reference is not None else []), *self.engines]
        found = actor_locations(actors, timeout_s=self.timeout_s)
        policy, rest = found[:len(self.policies)], found[len(self.policies):]
        out: dict[str, Any] = {"policy": [{"rank": r, **where} for r, where in enumerate(policy)]}
        if self.reference is not None:
            out["reference"], rest = rest[0], rest[1:]
        out["engines"] = [{"engine": i, **where} for i, where in enumerate(rest)]
        if self.node_placement is not None and not (self.use_gpu and self.cfg.colocate_all_models):
            for i, entry in enumerate(out["engines"]):
                entry["planned_nodes"] = list(self.node_placement.engine_nodes(i))
        out["rendezvous"] = ({"address": self.rendezvous[0], "port": self.rendezvous[1]}
                             if self.rendezvous is not None else None)
        return out

    def record_nodes(self, locations: dict[str, Any], labels: dict[str, str]) -> None:
        """Remember the node of every worker (``locations`` as :meth:`locations` gives them; ``labels``: node id ->
        how errors name the node), so a worker that dies or hangs is reported with its node."""
        entries = [*locations.get("policy", []), *([locations["reference"]] if locations.get("reference") else []),
                   *locations.get("engines", [])]
        actors = [*self.policies, *([self.reference] if self.reference is not None else []), *self.engines]
        for actor, entry in zip(actors, entries):
            actor_id = getattr(actor, "_actor_id", None)
            if actor_id is not None:
                self.worker_nodes[actor_id.hex()] = labels.get(entry["node_id"], entry.get("address", "?"))

    def _cpu_core_binds(self) -> list[str]:
        """This agent's share of the host's cores for its CPU engines: every engine of every agent gets its own
        cores (agents before this one take the first ranges)."""
        import os

        from openrlhf_hacpo.engines.placement import spread_cpu_cores

        counts = [a.vllm_num_engines for a in self.cfg.resolved_agents()]
        binds = spread_cpu_cores(sum(counts), sorted(os.sched_getaffinity(0)))
        offset = sum(counts[:self.index])
        return binds[offset:offset + counts[self.index]]

    def _core_share(self, process: int):
        """``hf_engine``: the share of its node's cores of this agent's process ``process`` (policy ranks, then the
        engine; :func:`~openrlhf_hacpo.engines.settings.split_cpu_cores`)."""
        from openrlhf_hacpo.engines.settings import CoreShare

        counts = tuple(a.dp_size + 1 for a in self.cfg.resolved_agents())
        return CoreShare(counts, self.index, process)

    def _create_hf_engine(self) -> None:
        """``hf_engine``: one :class:`~openrlhf_hacpo.engines.hf_engine.HFEngine` actor beside the policy, in the
        policy's placement group when it has one (on rank 0's node), with the last share of the agent's cores; its
        model loads while the policies set up (:meth:`_hf_engines_ready` waits for it)."""
        from openrlhf_hacpo.engines.hf_engine import create_hf_engine

        if self.use_gpu:
            raise ValueError(f"agent {self.name!r}: --rollout_backend hf_engine runs its engine on CPU cores; on GPUs "
                             "use --rollout_backend vllm (engine actors on GPUs) or hf (generate on the policy's GPU)")
        strategy = None
        if self._placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            strategy = PlacementGroupSchedulingStrategy(placement_group=self._placement_group,
                                                        placement_group_bundle_index=0)
        self.engines = [create_hf_engine(self.agent, seed=self.cfg.seed + 1000 * self.index,
                                         core_share=self._core_share(self.agent.dp_size),
                                         scheduling_strategy=strategy)]

    def _hf_engines_ready(self) -> None:
        """Wait until the engines have loaded their models, then pin each policy rank to its share of the cores
        (the policies have set up: the threads DeepSpeed started are pinned with them)."""
        import ray

        from openrlhf_hacpo.engines.hf_engine import HFEngine

        self._call(self.engines, HFEngine.ready, [()] * len(self.engines), self.engine_role, lambda v: v).result()
        ray.get([policy.__ray_call__.remote(_bind_policy_cores, self._core_share(rank))
                 for rank, policy in enumerate(self.policies)], timeout=self.timeout_s)

    def _engines_call(self, method: Callable[..., Any]) -> None:
        self._call(self.engines, method, [()] * len(self.engines), self.engine_role, lambda v: v).result()

    def _wake_engines(self) -> None:
        """Sleep mode, before a generation: wake whatever the engines still have asleep (everything, or after a
        weight sync, which woke only the weights, the KV cache). Engines hold GPU memory only from a weight sync or
        a generation to the end of the next generation.

        With ``deepspeed_enable_sleep`` the policies' DeepSpeed states leave the device first
        (:meth:`PolicyWorker.sleep`); they come back when the policies next score or train (:meth:`PolicyWorker.wake`,
        after the engines slept again)."""
        if self.agent.deepspeed_enable_sleep:
            self._all_policies(PolicyWorker.sleep, combine=lambda v: None).result()
        if self._engines_sleep and not self._engines_awake:
            self._engines_call(_engine_class().wake_up)
            self._engines_awake = True

    def _sleep_engines(self) -> None:
        if self._engines_sleep and self._engines_awake:
            self._engines_call(_engine_class().sleep)
            self._engines_awake = False

    # ------------------------------------------------------------------------------------------------ calls
    def _call(self, workers: Sequence[Any], method: Callable[..., Any], args_per_worker: Sequence[tuple], role: str,
              combine: Callable[[list[Any]], Any], kwargs_per_worker: Sequence[dict] | None = None) -> Pending:
        """Call ``method`` (a method of the workers' class, e.g. ``PolicyWorker.train_step``) on every worker: in
        this process for plain objects, as a Ray call on actor handles."""
        name = method.__name__
        kwargs_per_worker = kwargs_per_worker or [{} for _ in workers]
        if not self.use_ray:
            values = [getattr(w, name)(*a, **kw) for w, a, kw in zip(workers, args_per_worker, kwargs_per_worker)]
            return Pending(self, role, values, combine, remote=False)
        try:
            refs = [getattr(w, name).remote(*a, **kw)
                    for w, a, kw in zip(workers, args_per_worker, kwargs_per_worker)]
        except Exception as err:
            if is_actor_death(err):
                raise death_error(self, WorkerRef(role), err, phase_of(name)) from err
            raise
        return Pending(self, role, refs, combine, remote=True, method=name, workers=workers)

    def _all_policies(self, method: Callable[..., Any], *args: Any,
                      combine: Callable[[list[Any]], Any] = lambda v: v[0]) -> Pending:
        return self._call(self.policies, method, [args] * len(self.policies), "policy", combine)

    def rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int, rendered: Any = None) -> Pending:
        """Sample ``sampling.n`` responses per prompt; the result is the agent's :class:`RolloutResult` (its
        trajectories not yet verified), each trajectory stamped with the weights version that generated it (the
        engines' since their last sync, else the learner's).

        ``rendered`` (engine backends): the prompts as :meth:`render_for_rollout` rendered them, so that nothing of
        this rollout waits behind work already queued on the policies (``--one_step_off`` queues the rollout behind
        the update: its scoring pass then runs at the updated weights)."""
        sampling = mismatch_sampling(self.cfg, sampling)  # the engines' log-probs for the mismatch/* metrics
        if self.has_engines:
            return self._rollout_engines(prompts, sampling, step, rendered)
        version = self.policy_version
        shards = split_shards(prompts, len(self.policies))
        args = [(shard, shard_sampling(sampling, rank), step) for rank, shard in enumerate(shards)]
        return self._call(self.policies, PolicyWorker.rollout, args, "policy",
                          lambda parts: _stamped(RolloutResult.combine(parts), version))

    def render_for_rollout(self, prompts: Sequence[Any]) -> Pending:
        """Rank 0 renders ``prompts`` for the engines (the argument ``rendered`` of :meth:`rollout`)."""
        return self._call(self.policies[:1], PolicyWorker.render, [(list(prompts),)], "policy", lambda v: v[0])

    def _rollout_engines(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int,
                         rendered: Any = None) -> Pending:
        """Rank 0 renders the prompts once (unless given); the engines sample and every policy rank scores its
        prompts' responses.

        Both phases start now: each scoring call takes the engines' results as Ray arguments, so it runs as soon as
        they exist (sleeping engines are put back to sleep first: the scoring call waits for that too) and the
        agents' phases overlap however the driver waits. The ``generate`` phase runs from the rendering to the engines'
        outputs (read when the driver waits for them); ``engine_generate`` is the slowest engine's own time in its
        ``generate`` call (asked once the outputs are in: an actor runs one caller's calls in order, so no later
        generation has run on it yet); the ranks' results bring their ``scoring``.

        With ``--own_old_logp behaviour`` (``auto`` in a one-step-off run at temperature 1) the engines also return
        their log-probs of the sampled tokens, which the driver attaches to the trajectories
        (``Trajectory.behaviour_logp``).
        """
        timer = PhaseTimer()
        generated = timer.start("generate")  # ends when the engines' outputs are in
        version = self.engine_version
        behaviour = self.cfg.resolved_own_old_logp == "behaviour"
        if behaviour:
            sampling = replace(sampling, return_logprobs=True)
        if rendered is None:
            rendered = self.render_for_rollout(prompts).result()
        indices = list(range(len(prompts)))
        self._wake_engines()
        engine_shards = [s for s in split_shards(indices, len(self.engines)) if s]
        engines = self.engines[:len(engine_shards)]

        def generation_done(outputs: list[list[GenerationOutput]]) -> list[list[GenerationOutput]]:
            generated()
            return outputs

        generation = self._call(engines, _engine_class(self.cfg.rollout_backend).generate,
                                [([rendered.ids[i] for i in shard], shard_sampling(sampling, e))
                                 for e, shard in enumerate(engine_shards)], self.engine_role, generation_done)
        outputs = generation.parts
        if self._engines_sleep:  # engines sleep before the (colocated) policies score
            outputs = self._after_sleep(engines, outputs)
        shards = split_shards(indices, len(self.policies))
        args = [([prompts[i] for i in shard], rendered.select(shard), shard, engine_shards, step, *outputs)
                for shard in shards]
        scoring = self._call(self.policies, PolicyWorker.score_engine_outputs, args, "policy", RolloutResult.combine)

        def combine(parts: list[RolloutResult], outputs: list[list[GenerationOutput]]) -> RolloutResult:
            combined = _stamped(scoring.combine(parts), version)
            if behaviour:
                _attach_behaviour_logps(self.name, combined.trajectories, engine_shards, outputs,
                                        self.cfg.n_samples_per_prompt)
            engine_s = self._call(engines, _engine_class(self.cfg.rollout_backend).last_generate_seconds,
                                  [()] * len(engines), self.engine_role, max).result()
            return replace(combined, timings={**combined.timings, **timer.seconds, "engine_generate": engine_s})

        return Pending(self, scoring.role, scoring.parts, combine, scoring.remote, scoring.method, after=generation,
                       workers=scoring.workers)

    def _after_sleep(self, engines: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        """Engine e's outputs, available once engine e is asleep again (its ``sleep`` runs after its ``generate``:
        a Ray actor runs one caller's calls in order)."""
        slept = [engine.sleep.remote() for engine in engines]
        self._engines_awake = False
        return [_first_of_task().remote(out, done) for out, done in zip(outputs, slept)]

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> Pending:
        """Responses only (no scoring), prompt-major like :meth:`RolloutEngine.generate`; used for evaluation."""
        if self.has_engines:
            prompt_ids = self.render_prompts(prompts)
            self._wake_engines()
            shards = split_shards(list(range(len(prompts))), len(self.engines))
            args = [([prompt_ids[i] for i in shard], shard_sampling(sampling, e)) for e, shard in enumerate(shards)]
            workers, role = self.engines, self.engine_role
            method = _engine_class(self.cfg.rollout_backend).generate
        else:
            shards = split_shards(list(range(len(prompts))), len(self.policies))
            args = [([prompts[i] for i in shard], shard_sampling(sampling, r)) for r, shard in enumerate(shards)]
            workers, role, method = self.policies, "policy", PolicyWorker.generate

        def combine(parts: list[list[GenerationOutput]]) -> list[GenerationOutput]:
            if self.has_engines:
                self._sleep_engines()
                if self.agent.deepspeed_enable_sleep:
                    self._all_policies(PolicyWorker.wake, combine=lambda v: None).result()
            out = []
            for shard, outs in zip(shards, parts):
                out.extend(reindex(o, shard[o.prompt_index]) for o in outs)
            return out

        live = [(w, a, s) for w, a, s in zip(workers, args, shards) if s]
        shards = [s for _, _, s in live]
        return self._call([w for w, _, _ in live], method, [a for _, a, _ in live], role, combine)

    def render_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids as this agent generates from them (its chat template, left-truncated)."""
        return self._call(self.policies[:1], PolicyWorker.render_prompts, [(list(prompts),)], "policy",
                          lambda v: v[0]).result()

    def render_prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """Prompt texts as this agent's model reads them."""
        return self._call(self.policies[:1], PolicyWorker.render_prompt_texts, [(list(prompts),)], "policy",
                          lambda v: v[0]).result()

    def train_step(self, trajectories: Any, step: int, ratios: CapabilityRatios) -> Pending:
        """Start this learner's update on the step's trajectories (a list, or a Ray object reference to one shared by
        every learner); the result is a :class:`TrainStepResult` merging every rank's metrics."""
        if self.use_ray and isinstance(trajectories, (list, tuple)):
            import ray

            trajectories = ray.put(list(trajectories))  # one copy for all ranks
        return self._all_policies(PolicyWorker.train_step, trajectories, step, ratios,
                                  combine=TrainStepResult.combine)

    def train_own_rows_first(self, trajectories: Any, step: int, ratios: CapabilityRatios) -> Pending:
        """Phase 1 of a step with ``old_logp_from_update`` (:mod:`~openrlhf_hacpo.actors.first_update`): the result
        maps trajectory positions to this agent's old log-probs of its own responses, every rank's merged."""
        return self._all_policies(PolicyWorker.train_own_rows_first, trajectories, step, ratios,
                                  combine=lambda parts: {p: v for part in parts for p, v in part.items()})

    def train_finish(self, old_means: Sequence[float]) -> Pending:
        """Phase 2: the step's updates, given every trajectory's old log-prob mean; a :class:`TrainStepResult`."""
        return self._all_policies(PolicyWorker.train_finish, list(old_means), combine=TrainStepResult.combine)

    def sync_weights(self) -> float:
        """Copy the policy's weights into the agent's engines (vLLM or HF); returns seconds spent (0 without
        engines).

        The path is :meth:`weight_sync_mode`'s. Sleeping engines get back only their weights' memory for the copy
        (the policy ranks empty their CUDA cache first, :meth:`PolicyIO.sync_weights_to_engines`); their KV cache
        wakes just before the next generation (:meth:`_wake_engines`)."""
        self.engine_version = self.policy_version
        if not self.engines:
            return 0.0
        t0 = time.perf_counter()
        mode = self.weight_sync_mode()
        if mode == "broadcast" and not self._broadcast_ready:
            self._call(self.policies[:1], PolicyWorker.init_engine_weight_sync, [(self.engines,)], "policy",
                       lambda v: v[0]).result()
            self._broadcast_ready = True
        self._all_policies(PolicyWorker.sync_weights_to_engines, self.engines, mode).result()
        return time.perf_counter() - t0

    def weight_sync_mode(self) -> str:
        """How weights reach the engines: NCCL broadcast to dedicated GPU engines; CUDA IPC to colocated ones when
        every engine GPU holds a policy rank (NCCL cannot link two processes on one GPU); the object store else."""
        if not self.use_gpu:
            return "object_store"
        if not self.cfg.colocate_all_models:
            return "broadcast"
        engine_gpus = self.agent.vllm_num_engines * self.agent.vllm_tensor_parallel_size
        return "cuda_ipc" if self.agent.dp_size >= engine_gpus else "object_store"

    def weights(self) -> dict[str, Any]:
        """The policy's full weights by HF name, on CPU."""
        return self._all_policies(PolicyWorker.state_dict_for_sync).result()

    def save_hf(self, path: str) -> Pending:
        return self._all_policies(PolicyWorker.save_hf, path)

    def save_checkpoint(self, path: str) -> Pending:
        """Every rank saves its part under ``path``; the result is each rank's manifest of the files it wrote
        (:func:`~openrlhf_hacpo.actors.checkpoint_files.rank_manifest`), in rank order."""
        return self._all_policies(PolicyWorker.save_checkpoint, path, combine=list)

    def load_checkpoint(self, path: str) -> Pending:
        return self._all_policies(PolicyWorker.load_checkpoint, path)

    def shutdown(self) -> None:
        """Kill this agent's actors (a no-op without Ray)."""
        if not self.use_ray:
            return
        import ray

        for actor in [*self.policies, self.reference, *self.engines]:
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - already dead
                    pass
        from ray.util.placement_group import remove_placement_group

        for group in (self._placement_group, self._engine_placement_group):
            if group is not None:
                remove_placement_group(group)
        self._placement_group = self._engine_placement_group = None


def _stamped(result: RolloutResult, version: int) -> RolloutResult:
    """``result`` with every trajectory's ``policy_version`` set to ``version``."""
    for traj in result.trajectories:
        traj.policy_version = version
    return result


def _attach_behaviour_logps(agent: str, trajectories: Sequence[Any], engine_shards: Sequence[Sequence[int]],
                            outputs: Sequence[Sequence[GenerationOutput]], n: int) -> None:
    """Give each trajectory the log-probs its engine returned for its tokens (``Trajectory.behaviour_logp``).

    Engine e sampled the prompts ``engine_shards[e]`` (its ``prompt_index`` counts within them); the trajectories
    come prompt-major, ``n`` per prompt, in prompt order. Each pairing is checked on the token ids."""
    import torch

    by_row: dict[tuple[int, int], GenerationOutput] = {}
    for shard, outs in zip(engine_shards, outputs):
        for out in outs:
            by_row[(shard[out.prompt_index], out.sample_index)] = out
    if len(by_row) != len(trajectories):
        raise RuntimeError(f"agent {agent!r}: {len(by_row)} engine outputs for {len(trajectories)} trajectories")
    for row, traj in enumerate(trajectories):
        out = by_row.get((row // n, row % n))
        if out is None or out.logprobs is None or list(out.response_token_ids) != traj.source_token_ids:
            raise RuntimeError(f"agent {agent!r}: trajectory {row} ({traj.prompt_id!r}) has no engine output with "
                               "its token ids and log-probs")
        traj.behaviour_logp = torch.tensor(out.logprobs, dtype=torch.float32)


def _first_of(value: Any, *_: Any) -> Any:
    """``value``, once the other arguments (Ray object references) are ready too."""
    return value


@functools.cache
def _first_of_task():
    """:func:`_first_of` as a Ray task, exported once per process rather than once per rollout."""
    import ray

    return ray.remote(num_cpus=0)(_first_of)


def _engine_class(backend: str = "vllm"):
    """The engine class of ``backend`` (its module is loaded only when an agent has engines: the vLLM one imports
    Ray)."""
    if backend == "hf_engine":
        from openrlhf_hacpo.engines.hf_engine import HFEngine

        return HFEngine
    from openrlhf_hacpo.engines.vllm_engine import VLLMEngine

    return VLLMEngine


def _bind_policy_cores(_worker: Any, share: Any) -> list[int] | None:
    """Run inside a policy actor (``__ray_call__``): pin it to its share of its node's cores (``hf_engine``)."""
    from openrlhf_hacpo.engines.hf_engine import bind_to_share

    return bind_to_share(share)
