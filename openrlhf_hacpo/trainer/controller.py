"""The driver's step loop: N agents sample, share and learn (paper Algorithm 1).

One step t:

1. **rollout**: every agent samples G responses for the same prompt batch, concurrently; each agent's policy
   recomputes the old log-probs of its own responses at the rollout temperature (docs/training.md, "One step"),
   or, with ``old_logp_from_update``, its learner records them at its first update (for ``hacpo`` and ``naive``
   step 4 then runs in two phases, :mod:`~openrlhf_hacpo.actors.first_update`);
2. **reward**: every response is verified once, from its source's text (docs/training.md, "One step"), and stored in
   the shared :class:`~openrlhf_hacpo.rollout.RolloutStore`;
3. **capability**: the tracker appends each agent's P_τ and gives P̂ and the clipped ratio matrix (eqs. 8–9);
4. **update**: every learner, concurrently, trains on its view of the step's trajectories (own and, for
   ``hacpo`` / ``naive``, foreign) with mini-batch updates m = 0, 1, ...; all learners use the same pre-step
   snapshots, so their order cannot matter;
5. **sync**: updated weights go to the agent's engines (``vllm``, ``hf_engine`` backends);
6. **bookkeeping**: one metrics record per agent, periodic evaluation, joint checkpoints.

With ``--one_step_off`` steps 1–2 of step t+1 run during step 4 of step t: the next batch's prompts are rendered,
the learners' updates queued, then the next rollouts; the engines (still holding the weights of step t-1) generate
while the learners train, the scoring passes follow the updates on the policy actors, the rewards are verified once
the rollouts are in, and the sync after both gives the engines the weights of step t. Rows trained at step t >= 2 are
thus exactly one version stale (``Trajectory.policy_version``, ``rollout/staleness_*``); the batch in flight is
saved with every checkpoint (:mod:`~openrlhf_hacpo.trainer.in_flight`). The last step generates nothing.

Sampling is seeded by (run seed, step, agent), so a run resumed from a checkpoint samples exactly what an
uninterrupted run would have.

The controller's other jobs are in their own modules: Ray, the device, the agents' plans and where the workers
landed (:class:`~openrlhf_hacpo.trainer.run_cluster.RunCluster`); the run folder, resume and joint checkpoints
(:class:`~openrlhf_hacpo.trainer.run_checkpoints.RunCheckpoints`); one record per agent and step
(:func:`~openrlhf_hacpo.trainer.step_metrics.agent_step_record`).
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from openrlhf_hacpo.actors.agent_group import AgentGroup, AgentPhaseTimeout, AgentWorkerDied, Pending
from openrlhf_hacpo.actors.first_update import record_old_logps
from openrlhf_hacpo.actors.results import TrainStepResult
from openrlhf_hacpo.algorithms import CapabilityTracker
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.base import SamplingConfig
from openrlhf_hacpo.rollout import RewardRunner, RolloutStore
from openrlhf_hacpo.trainer.evaluation import Evaluator
from openrlhf_hacpo.trainer.failures import TrainingError, worker_failure
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint
from openrlhf_hacpo.trainer.fs_check import worker_node_ids
from openrlhf_hacpo.trainer.in_flight import GeneratedBatch
from openrlhf_hacpo.trainer.metrics import MetricsLogger
from openrlhf_hacpo.trainer.mismatch_watch import check_mismatch, mismatch_metrics
from openrlhf_hacpo.trainer.preflight import resolve_attention, resolve_hub_models
from openrlhf_hacpo.trainer.reward_watch import RewardStallWatcher
from openrlhf_hacpo.trainer.rollout_phase import finish_rollouts, rollout_sampling, start_rollouts
from openrlhf_hacpo.trainer.run_checkpoints import RunCheckpoints
from openrlhf_hacpo.trainer.run_cluster import RunCluster
from openrlhf_hacpo.trainer.run_folder import RunLock
from openrlhf_hacpo.trainer.run_inputs import check_run_inputs
from openrlhf_hacpo.trainer.step_metrics import step_records
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.utils.timing import PhaseTimer

__all__ = ["HACPOController", "TrainingError", "wait_all"]

logger = logging.getLogger(__name__)


def wait_all(pendings: Sequence[Pending]) -> list[Any]:
    """Wait for every pending result, in order (the work itself already runs on every agent at once)."""
    return [p.result() for p in pendings]


class HACPOController:
    """Owns the data loader, the shared rollout store, the capability tracker, checkpoints and the agents' groups.

    ``fit()`` runs the whole training; ``setup()`` (called by ``fit``) checks every input first: model and tokenizer
    paths, chat templates, the datasets and the reward function, each error naming the agent or file at fault.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.groups: list[AgentGroup] = []
        self.step = 0
        self.store = RolloutStore(keep_last_steps=1)
        self.tracker = CapabilityTracker(cfg.num_agents, cfg.algo.capability)
        self.history: list[list[dict[str, Any]]] = []
        self.eval_history: list[list[dict[str, Any]]] = []
        self.reward_runner: RewardRunner | None = None
        self.metrics: MetricsLogger | None = None
        self.evaluator: Evaluator | None = None
        self._ready = False
        lock = RunLock(cfg.outputs.save_path)
        self.cluster = RunCluster(cfg, lock)  # Ray, the device, the agents' plans, where the workers landed
        # taken before preflight resolves hub ids to local folders, so a resume compares the settings as given
        self.fingerprint = config_fingerprint(cfg)
        self.checkpoints = RunCheckpoints(cfg, self.fingerprint, self.cluster, lock)
        # the command-line arguments of this run, when started from the command line: failures then name the exact
        # command that resumes it (openrlhf_hacpo.trainer.failures.resume_command)
        self.argv: list[str] | None = None
        # --one_step_off: the next step's batch, generated while this step trained (trainer/in_flight.py)
        self.in_flight: GeneratedBatch | None = None
        self.reward_watch = RewardStallWatcher(cfg.agent_names, cfg.rewards.reward_fn, cfg.rewards.reward_stall_steps)

    # the run folder's lock, the newest complete checkpoint, <save_path>/train.log (RunCheckpoints)
    lock = property(lambda self: self.checkpoints.lock)
    last_checkpoint = property(lambda self: self.checkpoints.last_checkpoint)
    run_log = property(lambda self: self.checkpoints.run_log)

    # ------------------------------------------------------------------------------------------------ setup
    def preflight(self) -> None:
        """Check inputs before any worker starts (:func:`~openrlhf_hacpo.trainer.run_inputs.check_run_inputs`)."""
        self.dataloader, self.eval_records = check_run_inputs(self.cfg)

    @property
    def total_steps(self) -> int:
        steps = len(self.dataloader) * self.cfg.train.num_episodes
        return min(steps, self.cfg.train.max_steps) if self.cfg.train.max_steps is not None else steps

    def setup(self) -> None:
        """Preflight, start Ray (unless already running), plan every agent once and launch its workers where the
        plan puts them, resume if asked."""
        if self._ready:
            return
        cfg = self.cfg
        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed % 2**32)
        torch.manual_seed(cfg.train.seed)
        self.checkpoints.prepare()
        resolve_hub_models(cfg)
        resolve_attention(cfg)
        self.preflight()
        plans = self.cluster.plan()  # device, plans, their checks and nodes (trainer/run_cluster.py)
        if any(p.nodes is not None for p in plans):  # the workers' nodes are known: check the folders now
            self.cluster.check_shared_folders([n for p in plans if p.nodes is not None for n in p.nodes.nodes])
        total_updates = self.total_steps * cfg.updates_per_step
        self.groups = [AgentGroup(cfg, plan, total_updates, started_local_ray=self.cluster.started_local_ray)
                       for plan in plans]
        launches = [g.launch() for g in self.groups]
        self.worker_info = self._guard(lambda: wait_all(launches), "launching the workers")
        self.cluster.record_placement(self.groups)
        self.cluster.record_worker_nodes(self.groups)
        if all(p.nodes is None for p in plans):  # Ray placed the workers (one node): check where they landed
            self.cluster.check_shared_folders(worker_node_ids(self.cluster.placement))
        self.reward_runner = RewardRunner(cfg.rewards.reward_fn, num_workers=cfg.rewards.reward_num_workers,
                                          timeout_s=cfg.rewards.reward_timeout)
        if self.eval_records:
            self.evaluator = Evaluator(self.eval_records, self.reward_runner,
                                       cfg.eval.eval_generate_max_len or cfg.prompts.generate_max_len,
                                       cfg.eval.eval_n_samples, cfg.eval.eval_temperature, cfg.train.seed)
        if self.checkpoints.resume_state is not None:
            self._resume()
        wandb = None
        if cfg.logging.use_wandb:
            log = cfg.logging
            wandb = {"project": log.wandb_project, "name": log.wandb_run_name, "mode": log.wandb_mode,
                     "config": cfg.to_dict()}
        self.metrics = MetricsLogger(cfg.outputs.save_path, cfg.logging.use_tensorboard, wandb,
                                     total_steps=self.total_steps, show_progress=cfg.logging.progress_bar,
                                     initial_step=self.step)
        self._ready = True

    # ------------------------------------------------------------------------------------------------ loop
    def fit(self) -> list[list[dict[str, Any]]]:
        """Train until ``max_steps`` or the end of the last episode; returns the per-step metric records."""
        self.setup()
        cfg = self.cfg
        if self.evaluator is not None and cfg.eval.eval_before_training and self.step == 0:
            self.evaluate()
        while self.step < self.total_steps:
            records = self._guard(self.train_one_step, f"step {self.step + 1}")
            step = self.step
            if step % cfg.logging.logging_steps == 0 or step == self.total_steps:
                self.metrics.log_step(step, records)
            self.metrics.advance(records)
            if self.evaluator is not None and cfg.eval.eval_steps > 0 and step % cfg.eval.eval_steps == 0:
                self.evaluate()
            if cfg.outputs.save_steps > 0 and step % cfg.outputs.save_steps == 0:
                self.save_checkpoint()
        if self.evaluator is not None and (not self.eval_history or self.eval_history[-1][0]["step"] != self.step):
            self.evaluate()
        if cfg.outputs.save_final_checkpoint and (self.last_checkpoint is None
                                          or not self.last_checkpoint.name.endswith(f"step{self.step}")):
            self.save_checkpoint()
        if cfg.outputs.save_hf:
            self.save_hf()
        return self.history

    def _guard(self, fn, what: str):
        """Run ``fn``; a worker that died or hung becomes the one-line :class:`TrainingError` naming the agent, the
        worker, its node, the phase, the last complete checkpoint and the command that resumes
        (:func:`~openrlhf_hacpo.trainer.failures.worker_failure`)."""
        try:
            return fn()
        except (AgentWorkerDied, AgentPhaseTimeout) as err:
            raise worker_failure(what, err, self.last_checkpoint, self.cfg.checkpoint_dir, self.argv) from err

    def sampling_for(self, step: int, agent: str) -> SamplingConfig:
        """Agent ``agent``'s sampling at ``step`` (:func:`~openrlhf_hacpo.trainer.rollout_phase.rollout_sampling`)."""
        return rollout_sampling(self.cfg, step, agent)

    def train_one_step(self) -> list[dict[str, Any]]:
        """Run one full step (rollout, reward, capability, update, sync); returns one record per agent.

        With ``--one_step_off`` the step's batch was generated during the previous step (except the first step's and
        a resumed run's first batch without one in flight), and the next step's batch is generated while the
        learners train (:meth:`_train_and_generate`)."""
        cfg, step = self.cfg, self.step + 1
        timer = PhaseTimer()
        with timer.phase("step"):
            batch, self.in_flight = self.in_flight, None
            generated_now = batch is None
            if generated_now:
                batch = self._generate(step, self.dataloader.next_batch())
            if batch.step != step:
                raise TrainingError(f"step {step}: the batch in flight was generated for step {batch.step}")
            rollouts, trajectories = batch.rollouts, batch.trajectories
            check_mismatch(step, rollouts, cfg.resolved_agents, cfg)  # a broken weight sync stops here
            self.reward_watch.update(step, [[t.reward for t in trajectories if t.source == k]
                                            for k in range(cfg.num_agents)])
            self.store.add(trajectories)

            # 3) capability: this step's P_τ, P̂ over the window (this step included) and the clipped ratios
            with timer.phase("capability"):
                per_agent = [torch.tensor(rs, dtype=torch.float64)
                             for rs in self.store.rewards_by_source(step, cfg.num_agents)]
                capability = self.tracker.update(per_agent)
                ratios = self.tracker.ratios()

            # 4) every learner from the same pre-step snapshots, concurrently (and the next batch's generation)
            versions = [g.policy_version for g in self.groups]
            trained, self.in_flight = self._train_and_generate(step, trajectories, ratios, timer)
            for group in self.groups:  # the weights every learner now holds
                group.policy_version = step
            if cfg.outputs.save_rollouts:  # after training: with old_logp_from_update the learners scored them
                self.store.dump_jsonl(step, Path(cfg.outputs.save_path) / "rollouts" / f"step_{step:06d}.jsonl")

            # 5) weight sync to the rollout engines
            sync_s = [g.sync_weights() for g in self.groups]
        self.step = step

        # the driver's waits of this step: for its own batch (generated now) or for the next one (generated meanwhile)
        waited = batch.phases if generated_now else self.in_flight.phases if self.in_flight is not None else {}
        phases = {"rollout_phase": 0.0, "reward": 0.0, **timer.seconds, **waited}
        names = [g.name for g in self.groups]
        records = step_records(step, names, self.store.summary(step), trajectories, capability, ratios, rollouts,
                               trained, phases, sync_s, versions, cfg.algo.trains_on_foreign)
        for record, mismatch in zip(records, mismatch_metrics(rollouts, names, cfg.algo.trains_on_foreign)):
            record.update(mismatch)
        self.history.append(records)
        return records

    def _generate(self, step: int, prompts: Sequence[Any]) -> GeneratedBatch:
        """1) rollouts of every agent on the same prompts, concurrently; 2) one verification per trajectory."""
        return finish_rollouts(step, start_rollouts(self.cfg, self.groups, step, prompts), self.reward_runner)

    def _shared(self, trajectories: list[Any]) -> Any:
        """The step's trajectories as every learner receives them: with Ray one copy in the object store."""
        if not self.cfg.cluster.use_ray:
            return trajectories
        import ray

        return ray.put(trajectories)

    def _train_and_generate(self, step: int, trajectories: list[Any], ratios: Any,
                            timer: PhaseTimer) -> tuple[list[TrainStepResult], GeneratedBatch | None]:
        """Every learner's update on ``trajectories``; with ``--one_step_off`` (and a next step to come) the next
        step's batch too, generated by the engines meanwhile (they hold the weights of the previous step).

        Order of calls (each agent's policy actor runs its calls in the order they arrive): the next batch's prompts
        are rendered first, then every ``train_step`` is queued, then every rollout; the rollouts' scoring passes
        therefore run after the updates, at the new weights (``--own_old_logp recompute``), while the engines
        generate during the updates. The next batch's rewards are verified once its rollouts are in."""
        cfg = self.cfg
        overlap = cfg.train.one_step_off and step < self.total_steps
        rendered: list[Any] | None = None
        if overlap:
            prompts = self.dataloader.next_batch()
            rendered = wait_all([g.render_for_rollout(prompts) for g in self.groups])
        with timer.phase("train_phase"):
            shared = self._shared(trajectories)
            if not cfg.compute.old_logp_from_update:
                training = [g.train_step(shared, step, ratios) for g in self.groups]
                generating = start_rollouts(cfg, self.groups, step + 1, prompts, rendered) if overlap else None
                trained: list[TrainStepResult] = wait_all(training)
            elif not cfg.trains_on_foreign:  # gspo / grpo: no learner reads another's old log-probs, one call each
                trained = wait_all([g.train_step(shared, step, ratios) for g in self.groups])
                record_old_logps(trajectories, [t.old_logp_sums for t in trained])
                generating = None
            else:  # own rows first, their old log-probs to every learner, then the rest (actors/first_update)
                own = wait_all([g.train_own_rows_first(shared, step, ratios) for g in self.groups])
                old_means = record_old_logps(trajectories, own)
                trained = wait_all([g.train_finish(old_means) for g in self.groups])
                generating = None
        next_batch = finish_rollouts(step + 1, generating, self.reward_runner) if generating is not None else None
        return trained, next_batch

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate(self) -> list[dict[str, Any]]:
        """Evaluate every agent alone on the validation prompts (greedy accuracy, pass@k) and log it."""
        if self.evaluator is None:
            raise ValueError("no eval_data was given")
        records = self._guard(lambda: self.evaluator.evaluate(self.groups, self.step), f"evaluation at step "
                              f"{self.step}")
        self.eval_history.append(records)
        self.metrics.log_eval(self.step, records)
        return records

    # ------------------------------------------------------------------------------------------------ checkpoints
    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "agents": self.cfg.agent_names,
            "algorithm": self.cfg.algo.algorithm,
            "dataloader": self.dataloader.state_dict(),
            "tracker": self.tracker.state_dict(),
            "rng": capture_rng_state(cuda=False),
            "seed": self.cfg.train.seed,
            "fingerprint": self.fingerprint,
            # --one_step_off: the next step's batch, generated by weights no checkpoint keeps
            **({"in_flight": self.in_flight.state_dict()} if self.in_flight is not None else {}),
        }

    def save_checkpoint(self) -> Path:
        """Write the joint checkpoint of the current step (:meth:`RunCheckpoints.save
        <openrlhf_hacpo.trainer.run_checkpoints.RunCheckpoints.save>`: atomic, verified, old ones pruned)."""
        return self._guard(lambda: self.checkpoints.save(self.step, self.trainer_state(), self.groups),
                           f"saving the checkpoint of step {self.step}")

    def _resume(self) -> None:
        """Load every agent's part of the checkpoint ``--resume`` chose, then the driver's state; the engines receive
        the restored weights."""
        state = self.checkpoints.load_agents(self.groups, self._guard)
        checkpoint = self.last_checkpoint
        self.step = int(state["step"])
        self.dataloader.load_state_dict(state["dataloader"])
        self.tracker.load_state_dict(state["tracker"])
        restore_rng_state(state["rng"])
        if "in_flight" in state:
            self.in_flight = GeneratedBatch.from_state(state["in_flight"], self.cfg.num_agents,
                                                       f"checkpoint {checkpoint}")
        for group in self.groups:  # the weights every group now holds (its engines too, after the sync below)
            group.policy_version = self.step
        # the engines were built from `pretrain`: the first rollout must sample from the restored weights
        self._guard(lambda: [g.sync_weights() for g in self.groups], f"syncing the weights of {checkpoint}")
        logger.info("resumed from %s (step %d)", checkpoint, self.step)

    def save_hf(self) -> list[str]:
        """Per-agent Hugging Face checkpoints under ``<save_path>/hf/<agent>/``."""
        return self.checkpoints.save_hf(self.groups, self._guard)

    # ------------------------------------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop the workers, the reward pool and the sinks (and Ray, if this controller started it), release the
        run folder. Every part is attempted even when an earlier one fails; a failure is logged as a warning and not
        raised, so it cannot hide the error that ended the run (``close`` runs in a ``finally``)."""

        def attempt(fn) -> None:
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - logged; the run's own error stays the one reported
                logger.warning("shutdown: %s: %s", type(err).__name__, err)

        if self.metrics is not None:
            attempt(self.metrics.close)
        if self.reward_runner is not None:
            attempt(self.reward_runner.close)
        for group in self.groups:
            attempt(group.shutdown)
        attempt(self.cluster.shutdown)
        attempt(self.lock.release)
        self.checkpoints.close()
