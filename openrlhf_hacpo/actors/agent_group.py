"""Everything one agent is, behind one handle: its policy workers, its reference worker and its rollout engines.

The controller talks to an agent only through its :class:`AgentGroup`. With Ray (the default) the workers are
actors: ``dp_size`` :class:`~openrlhf_hacpo.actors.policy.PolicyWorker` ranks (Ray actors) forming the agent's own
``torch.distributed`` group, an optional :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker` (when the agent's
plan has one: a KL term and no LoRA adapter, :attr:`~openrlhf_hacpo.actors.agent_plan.AgentPlan.has_reference`) and
its rollout engines: ``vllm_num_engines`` vLLM engine actors for the ``vllm`` backend, one
:class:`~openrlhf_hacpo.engines.hf_engine.HFEngine` actor (transformers ``generate``) for ``hf_engine``, none for
``hf`` (the policy generates). Without Ray (``use_ray=False``) one plain
:class:`~openrlhf_hacpo.actors.policy.PolicyWorker` runs in the driver process.

The group's jobs are split by module: the launch where the agent's :class:`~openrlhf_hacpo.actors.agent_plan.
AgentPlan` puts the workers (:mod:`~openrlhf_hacpo.actors.agent_launch`), rollouts and generations
(:mod:`~openrlhf_hacpo.actors.agent_rollout`, with the engines' behaviour log-probs), and here the fan-out of calls,
the training phases, the weight sync and checkpoint I/O.

Methods that start work on the workers return a :class:`Pending`; ``Pending.result()`` waits for it and gives one
typed value (:mod:`openrlhf_hacpo.actors.results`). Starting the same phase on every agent before waiting on any makes
the agents work concurrently; an engine rollout starts generation and scoring at once (the scoring waits for the
engines' outputs inside Ray), so its pending is one level too. A worker that dies surfaces as
:class:`AgentWorkerDied` naming the agent; a wait longer than ``--step_timeout`` (a hung or stopped worker) surfaces as
:class:`AgentPhaseTimeout` naming the agent, the worker and the phase.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from openrlhf_hacpo.actors.agent_launch import AgentLaunch, worker_locations, worker_node_labels
from openrlhf_hacpo.actors.agent_plan import AgentPlan
from openrlhf_hacpo.actors.agent_rollout import AgentRollout
from openrlhf_hacpo.actors.pending import (AgentPhaseTimeout, AgentWorkerDied, Pending, WorkerRef, death_error,
                                           is_actor_death, phase_of)
from openrlhf_hacpo.actors.policy import PolicyWorker
from openrlhf_hacpo.actors.results import TrainStepResult
from openrlhf_hacpo.algorithms import CapabilityRatios
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.engines.base import SamplingConfig

__all__ = ["AgentGroup", "AgentPhaseTimeout", "AgentWorkerDied", "Pending"]


class AgentGroup:
    """One agent's workers.

    Args:
        cfg: the run configuration.
        plan: the agent's plan (:func:`~openrlhf_hacpo.actors.agent_plan.plan_agents`, with the node of every bundle
            on a multi-node cluster): its ranks, engines, bundles, reference and LoRA; the driver plans once.
        total_updates: optimizer updates of the whole run (learning-rate schedule).
        started_local_ray: the driver started its own local Ray (the group then meets on ``--bind_host``); None
            asks Ray (:func:`~openrlhf_hacpo.utils.network.driver_started_ray`).
    """

    def __init__(self, cfg: TrainConfig, plan: AgentPlan, total_updates: int,
                 started_local_ray: bool | None = None) -> None:
        self.cfg = cfg
        self.plan = plan
        self.index = plan.index
        self.agent: AgentConfig = cfg.resolved_agents[plan.index]  # model and tokenizer settings
        self.name = plan.name
        self.total_updates = total_updates
        self.use_gpu = plan.on_gpu
        self.use_ray = cfg.cluster.use_ray
        self.timeout_s: float | None = cfg.cluster.step_timeout
        self.policies: list[Any] = []
        self.reference: Any = None
        self.engines: list[Any] = []
        self.started_local_ray = started_local_ray
        self.rendezvous: tuple[str, int] | None = None  # where the agent's DeepSpeed group met (dp > 1)
        # actor id (hex) -> the node it runs on, for error messages (:meth:`record_nodes`)
        self.worker_nodes: dict[str, str] = {}
        self.launcher = AgentLaunch(self)
        self.rollouts = AgentRollout(self)
        self._broadcast_ready = False
        # weights versions (training steps taken): the learner's (set by the controller after each step and on
        # resume), and the one its engines hold since the last sync; every rollout stamps its trajectories with the
        # version that generated them (Trajectory.policy_version)
        self.policy_version = 0
        self.engine_version = 0

    placement_timeout_s: float = 300.0
    """How long to wait for Ray to place a placement group before failing with the GPU counts."""

    # ------------------------------------------------------------------------------------------------ launch
    def launch(self) -> Pending:
        """Create the workers where the plan puts them and start their setup (model loading, DeepSpeed init;
        :class:`~openrlhf_hacpo.actors.agent_launch.AgentLaunch`)."""
        return self.launcher.start()

    def actors(self) -> list[Any]:
        """The agent's workers in order: policy ranks, the reference (when it has one), the engines."""
        return [*self.policies, *([self.reference] if self.reference is not None else []), *self.engines]

    def locations(self) -> dict[str, Any]:
        """Where this agent's workers landed (:func:`~openrlhf_hacpo.actors.agent_launch.worker_locations`)."""
        return worker_locations(self)

    def record_nodes(self, locations: dict[str, Any], labels: dict[str, str]) -> None:
        """Remember the node of every worker (``locations`` as :meth:`locations` gives them; ``labels``: node id ->
        how errors name the node), so a worker that dies or hangs is reported with its node."""
        self.worker_nodes.update(worker_node_labels(self, locations, labels))

    # ------------------------------------------------------------------------------------------------ calls
    def call(self, workers: Sequence[Any], method: Callable[..., Any], args_per_worker: Sequence[tuple], role: str,
             combine: Callable[[list[Any]], Any], kwargs_per_worker: Sequence[dict] | None = None) -> Pending:
        """Call ``method`` (a method of the workers' class, e.g. ``PolicyWorker.train_step``) on every worker: in
        this process for plain objects, as a Ray call on actor handles; ``combine`` makes the result one value."""
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

    def all_policies(self, method: Callable[..., Any], *args: Any,
                     combine: Callable[[list[Any]], Any] = lambda v: v[0]) -> Pending:
        """:meth:`call` of ``method`` with the same ``args`` on every policy rank (the result: rank 0's)."""
        return self.call(self.policies, method, [args] * len(self.policies), "policy", combine)

    # ------------------------------------------------------------------------------------------------ rollout
    def rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int, rendered: Any = None) -> Pending:
        """Sample ``sampling.n`` responses per prompt; the result is the agent's :class:`RolloutResult` (its
        trajectories not yet verified), each trajectory stamped with the weights version that generated it (the
        engines' since their last sync, else the learner's; :class:`~openrlhf_hacpo.actors.agent_rollout.
        AgentRollout`).

        ``rendered`` (engine backends): the prompts as :meth:`render_for_rollout` rendered them, so that nothing of
        this rollout waits behind work already queued on the policies (``--one_step_off`` queues the rollout behind
        the update: its scoring pass then runs at the updated weights)."""
        return self.rollouts.rollout(prompts, sampling, step, rendered)

    def render_for_rollout(self, prompts: Sequence[Any]) -> Pending:
        """Rank 0 renders ``prompts`` for the engines (the argument ``rendered`` of :meth:`rollout`)."""
        return self.rollouts.render_for_rollout(prompts)

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> Pending:
        """Responses only (no scoring), prompt-major like :meth:`RolloutEngine.generate`; used for evaluation; the
        result is a list of :class:`GenerationOutput`."""
        return self.rollouts.generate(prompts, sampling)

    def render_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids as this agent generates from them (its chat template, left-truncated)."""
        return self.rollouts.render_prompts(prompts)

    def render_prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """Prompt texts as this agent's model reads them."""
        return self.rollouts.render_prompt_texts(prompts)

    # ------------------------------------------------------------------------------------------------ training
    def train_step(self, trajectories: Any, step: int, ratios: CapabilityRatios) -> Pending:
        """Start this learner's update on the step's trajectories (a list, or a Ray object reference to one shared by
        every learner); the result is a :class:`TrainStepResult` merging every rank's metrics."""
        if self.use_ray and isinstance(trajectories, (list, tuple)):
            import ray

            trajectories = ray.put(list(trajectories))  # one copy for all ranks
        return self.all_policies(PolicyWorker.train_step, trajectories, step, ratios,
                                 combine=TrainStepResult.combine)

    def train_own_rows_first(self, trajectories: Any, step: int, ratios: CapabilityRatios) -> Pending:
        """Phase 1 of a step with ``old_logp_from_update`` (:mod:`~openrlhf_hacpo.actors.first_update`): the result
        maps trajectory positions to this agent's old log-probs of its own responses, every rank's merged."""
        return self.all_policies(PolicyWorker.train_own_rows_first, trajectories, step, ratios,
                                 combine=lambda parts: {p: v for part in parts for p, v in part.items()})

    def train_finish(self, old_means: Sequence[float]) -> Pending:
        """Phase 2: the step's updates, given every trajectory's old log-prob mean; a :class:`TrainStepResult`."""
        return self.all_policies(PolicyWorker.train_finish, list(old_means), combine=TrainStepResult.combine)

    def sync_weights(self) -> float:
        """Copy the policy's weights into the agent's engines (vLLM or HF); returns seconds spent (0 without
        engines).

        The path is :meth:`weight_sync_mode`'s. Sleeping engines get back only their weights' memory for the copy
        (the policy ranks empty their CUDA cache first, :meth:`PolicyIO.sync_weights_to_engines`); their KV cache
        wakes just before the next generation (:meth:`AgentRollout.wake_engines
        <openrlhf_hacpo.actors.agent_rollout.AgentRollout.wake_engines>`)."""
        self.engine_version = self.policy_version
        if not self.engines:
            return 0.0
        t0 = time.perf_counter()
        mode = self.weight_sync_mode()
        if mode == "broadcast" and not self._broadcast_ready:
            self.call(self.policies[:1], PolicyWorker.init_engine_weight_sync, [(self.engines,)], "policy",
                      lambda v: v[0]).result()
            self._broadcast_ready = True
        self.all_policies(PolicyWorker.sync_weights_to_engines, self.engines, mode).result()
        return time.perf_counter() - t0

    def weight_sync_mode(self) -> str:
        """How weights reach the engines (the plan's :attr:`~openrlhf_hacpo.actors.agent_plan.AgentPlan.
        weight_sync_mode`): NCCL broadcast, CUDA IPC or the object store."""
        return self.plan.weight_sync_mode

    def weights(self) -> dict[str, Any]:
        """The policy's full weights by HF name, on CPU."""
        return self.all_policies(PolicyWorker.state_dict_for_sync).result()

    def save_hf(self, path: str) -> Pending:
        return self.all_policies(PolicyWorker.save_hf, path)

    def save_checkpoint(self, path: str) -> Pending:
        """Every rank saves its part under ``path``; the result is each rank's manifest of the files it wrote
        (:func:`~openrlhf_hacpo.actors.checkpoint_files.rank_manifest`), in rank order."""
        return self.all_policies(PolicyWorker.save_checkpoint, path, combine=list)

    def load_checkpoint(self, path: str) -> Pending:
        return self.all_policies(PolicyWorker.load_checkpoint, path)

    def shutdown(self) -> None:
        """Kill this agent's actors and remove its placement groups (a no-op without Ray)."""
        if not self.use_ray:
            return
        import ray

        for actor in self.actors():
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.launcher.remove_placement_groups()
