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
"""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from openrlhf_hacpo.actors.first_update import record_old_logps
from openrlhf_hacpo.actors.agent_group import AgentGroup, AgentPhaseTimeout, AgentWorkerDied, Pending
from openrlhf_hacpo.actors.results import RolloutResult, TrainStepResult
from openrlhf_hacpo.algorithms import CapabilityTracker
from openrlhf_hacpo.engines.base import SamplingConfig
from openrlhf_hacpo.engines.node_plan import PLACEMENT_FILE, AgentPlacement, nodes_from_ray
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.rollout import RewardFunctionError, RewardRunner, RolloutStore
from openrlhf_hacpo.trainer.checkpoint import CheckpointManager
from openrlhf_hacpo.trainer.in_flight import GeneratedBatch
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.trainer.evaluation import Evaluator
from openrlhf_hacpo.trainer.failures import TrainingError, worker_failure
from openrlhf_hacpo.trainer.fs_check import (FS_CHECK_TIMEOUT_S, check_shared_folders, node_labels, remove_on_nodes,
                                             worker_node_ids)
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint, fingerprint_differences
from openrlhf_hacpo.trainer.metrics import MetricsLogger
from openrlhf_hacpo.trainer.mismatch_watch import check_mismatch, mismatch_metrics
from openrlhf_hacpo.trainer.preflight import (check_node_placement, resolve_attention, resolve_hub_models,
                                              run_gpu_stack_preflight)
from openrlhf_hacpo.trainer.reward_watch import RewardStallWatcher
from openrlhf_hacpo.trainer.run_folder import RunLock, check_run_folder, run_outputs
from openrlhf_hacpo.trainer.run_inputs import check_run_inputs
from openrlhf_hacpo.trainer.step_metrics import agent_step_record
from openrlhf_hacpo.utils.atomic import atomic_write_json
from openrlhf_hacpo.utils.errors import CheckpointError, RunFolderError
from openrlhf_hacpo.utils.logging_setup import LOG_FILE, attach_run_log
from openrlhf_hacpo.utils.network import driver_started_ray
from openrlhf_hacpo.utils.shutdown import keep_signal_handlers
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
        self.ckpt = CheckpointManager(cfg.checkpoint_dir, max_keep=cfg.max_ckpt_num)
        self.history: list[list[dict[str, Any]]] = []
        self.eval_history: list[list[dict[str, Any]]] = []
        self.last_checkpoint: Path | None = None
        self.reward_runner: RewardRunner | None = None
        self.metrics: MetricsLogger | None = None
        self.evaluator: Evaluator | None = None
        self._started_ray = False
        # this process started the Ray instance the run uses (ranks then meet on --bind_host), as opposed to joining
        # a cluster by any route (openrlhf_hacpo.utils.network.driver_started_ray)
        self.started_local_ray = False
        self.placement: dict[str, Any] = {}
        self._ready = False
        self.lock = RunLock(cfg.save_path)
        self._log_handler: logging.Handler | None = None
        # the command-line arguments of this run, when started from the command line: failures then name the exact
        # command that resumes it (openrlhf_hacpo.trainer.failures.resume_command)
        self.argv: list[str] | None = None
        # node id -> "address (host, node id)", for errors naming a node (filled once the workers are placed)
        self.node_labels: dict[str, str] = {}
        # <save_path>/train.log once this run logs there (the command line appends the final error to it)
        self.run_log: Path | None = None
        self._resume_state: tuple[Path, dict[str, Any]] | None = None
        # --one_step_off: the next step's batch, generated while this step trained (trainer/in_flight.py)
        self.in_flight: GeneratedBatch | None = None
        self.reward_watch = RewardStallWatcher(cfg.agent_names, cfg.reward_fn, cfg.reward_stall_steps)
        # taken before preflight resolves hub ids to local folders, so a resume compares the settings as given
        self.fingerprint = config_fingerprint(cfg)

    # ------------------------------------------------------------------------------------------------ setup
    def preflight(self) -> None:
        """Check inputs before any worker starts (:func:`~openrlhf_hacpo.trainer.run_inputs.check_run_inputs`)."""
        self.dataloader, self.eval_records = check_run_inputs(self.cfg)

    def _prepare_run_folder(self) -> None:
        """Take the run lock, refuse or clear an earlier run's outputs, remove stale save leftovers, log to the
        folder; on ``--resume`` read and check the trainer state now, before any worker starts. The lock comes first:
        a run still using the folder refuses this driver before ``--overwrite`` deletes anything."""
        cfg = self.cfg
        self.lock.acquire()
        check_run_folder(cfg, cfg.overwrite)
        self._log_handler = attach_run_log(cfg.save_path)
        self.run_log = Path(cfg.save_path) / LOG_FILE
        self.ckpt.clean_stale()
        if cfg.resume:
            checkpoint = self.ckpt.latest()
            if checkpoint is None:
                outputs = run_outputs(cfg)
                if outputs:
                    raise RunFolderError(f"--resume: no checkpoint under {cfg.checkpoint_dir}, but {cfg.save_path} "
                                         f"holds a run's outputs ({', '.join(map(str, outputs))}) that a fresh start "
                                         "would replace; start over with --overwrite instead of --resume")
                logger.warning("--resume: no checkpoint under %s, starting from scratch", cfg.checkpoint_dir)
                return
            state = self.ckpt.load_trainer_state(checkpoint)
            if state.get("agents") != cfg.agent_names:
                raise ValueError(f"checkpoint {checkpoint} holds agents {state.get('agents')}, this run has "
                                 f"{cfg.agent_names}")
            self.ckpt.check_complete(checkpoint, cfg.agent_names)
            stored = state.get("fingerprint")
            differences = fingerprint_differences(stored, self.fingerprint) if stored is not None else []
            if differences and not cfg.resume_accept_mismatch:
                raise CheckpointError(f"checkpoint {checkpoint} was written with other settings; resume with the same "
                                      "settings, or pass --resume_accept_mismatch to continue with the new ones: "
                                      + "; ".join(differences))
            if differences:
                logger.warning("--resume_accept_mismatch: continuing %s with changed settings: %s", checkpoint,
                               "; ".join(differences))
            self._resume_state = (checkpoint, state)

    @property
    def total_steps(self) -> int:
        steps = len(self.dataloader) * self.cfg.num_episodes
        return min(steps, self.cfg.max_steps) if self.cfg.max_steps is not None else steps

    def setup(self) -> None:
        """Preflight, start Ray (unless already running), launch every agent's workers, resume if asked."""
        if self._ready:
            return
        cfg = self.cfg
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)
        self._prepare_run_folder()
        resolve_hub_models(cfg)
        resolve_attention(cfg)
        self.preflight()
        use_gpu = self._use_gpu()
        run_gpu_stack_preflight(cfg, use_gpu, self._cluster_gpus())
        node_plan = self._node_plan(use_gpu)
        if node_plan is not None:  # the workers' nodes are known: check the folders before any model loads
            self._check_shared_folders([n for placement in node_plan for n in placement.nodes])
        total_updates = self.total_steps * cfg.updates_per_step
        self.groups = [AgentGroup(cfg, i, total_updates, use_gpu=use_gpu,
                                  node_placement=node_plan[i] if node_plan is not None else None,
                                  started_local_ray=self.started_local_ray) for i in range(cfg.num_agents)]
        launches = [g.launch() for g in self.groups]
        self.worker_info = self._guard(lambda: wait_all(launches), "launching the workers")
        self.placement = self._record_placement()
        self._record_worker_nodes()
        if node_plan is None:  # Ray placed the workers (a one-node cluster): check the nodes they landed on
            self._check_shared_folders(worker_node_ids(self.placement))
        self.reward_runner = RewardRunner(cfg.reward_fn, num_workers=cfg.reward_num_workers,
                                          timeout_s=cfg.reward_timeout)
        if self.eval_records:
            self.evaluator = Evaluator(self.eval_records, self.reward_runner,
                                       cfg.eval_generate_max_len or cfg.generate_max_len, cfg.eval_n_samples,
                                       cfg.eval_temperature, cfg.seed)
        if self._resume_state is not None:
            self._resume()
        wandb = None
        if cfg.use_wandb:
            wandb = {"project": cfg.wandb_project, "name": cfg.wandb_run_name, "mode": cfg.wandb_mode,
                     "config": cfg.to_dict()}
        self.metrics = MetricsLogger(cfg.save_path, cfg.use_tensorboard, wandb, total_steps=self.total_steps,
                                     show_progress=cfg.progress_bar, initial_step=self.step)
        self._ready = True

    def _use_gpu(self) -> bool:
        cfg = self.cfg
        if cfg.device != "auto":
            if cfg.device == "cuda" and not cfg.use_ray and not torch.cuda.is_available():
                raise ValueError("device='cuda' but no CUDA device is visible")
            if cfg.use_ray:
                self._init_ray()
            return cfg.device == "cuda"
        if not cfg.use_ray:
            return torch.cuda.is_available()
        import ray

        self._init_ray()
        return ray.cluster_resources().get("GPU", 0) > 0

    def _cluster_gpus(self) -> float | None:
        if not self.cfg.use_ray:
            return None
        import ray

        return float(ray.cluster_resources().get("GPU", 0))

    def _init_ray(self) -> None:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            address = self.cfg.ray_address or os.environ.get("RAY_ADDRESS")
            if address:
                with keep_signal_handlers():
                    ray.init(address=address, log_to_driver=True)
            else:
                with keep_signal_handlers():
                    ray.init(ignore_reinit_error=True, log_to_driver=True, include_dashboard=False,
                             _node_ip_address=self.cfg.bind_host)
                self._started_ray = True
                self.lock.record_processes(_ray_process_ids())
        self.started_local_ray = driver_started_ray()

    def _node_plan(self, use_gpu: bool) -> list[AgentPlacement] | None:
        """The node of every agent's bundles (GPUs; CPUs on a CPU-only run), checked against every node's size
        (``ray.nodes()``); None without Ray and on a one-node cluster, where Ray packs each agent's GPU bundles as it
        always has (checked to fit) and CPU workers ask for no CPUs (not checked: they share the node's cores)."""
        if not self.cfg.use_ray:
            return None
        import ray

        nodes = nodes_from_ray(ray.nodes())
        if len(nodes) < 2 and not use_gpu:
            return None
        plan = check_node_placement(self.cfg, nodes, "GPU" if use_gpu else "CPU")
        if len(nodes) < 2:
            return None
        address = {n.node_id: n.label for n in nodes}
        for placement in plan:
            logger.info("placement plan: agent %r: policy bundles on %s; engine bundles on %s", placement.agent,
                        ", ".join(address[n] for n in placement.policy),
                        ", ".join(address[n] for n in placement.engines) or "(none dedicated)")
        return plan

    def _record_placement(self) -> dict[str, Any]:
        """Log where every worker and engine landed (node address and id, GPU ids) and write it to
        ``<save_path>/placement.json``; ``{}`` without Ray."""
        if not self.cfg.use_ray:
            return {}
        try:
            placement = {g.name: g.locations() for g in self.groups}
        except Exception as err:  # noqa: BLE001 - a record, not a reason to stop the run
            logger.warning("could not record where the workers landed: %s: %s", type(err).__name__, err)
            return {}
        for agent, roles in placement.items():
            for role, entries in roles.items():
                if role == "rendezvous":
                    if entries is not None:
                        logger.info("agent %r: DeepSpeed group meets on %s:%d", agent, entries["address"],
                                    entries["port"])
                    continue
                for entry in entries if isinstance(entries, list) else [entries]:
                    index = entry.get("rank", entry.get("engine"))
                    which = f" {index}" if index is not None else ""
                    logger.info("agent %r %s%s on %s (node %s), GPUs %s", agent, role, which, entry["address"],
                                entry["node_id"][:8], ",".join(entry["gpu_ids"]) or "none")
        atomic_write_json(Path(self.cfg.save_path) / PLACEMENT_FILE, placement)
        return placement

    def _record_worker_nodes(self) -> None:
        """Give every agent group the node of each of its workers (from the placement records), for errors."""
        if not (self.cfg.use_ray and self.placement):
            return
        import ray

        self.node_labels = node_labels(ray.nodes())
        for group in self.groups:
            group.record_nodes(self.placement.get(group.name, {}), self.node_labels)

    def _check_shared_folders(self, node_ids: list[str]) -> None:
        """Prove that the nodes ``node_ids`` (those hosting a worker) share the run folder and the checkpoint folder
        with the driver (:mod:`openrlhf_hacpo.trainer.fs_check`; no task runs when they are all the driver's)."""
        if not self.cfg.use_ray:
            return
        import ray

        if not node_ids:
            logger.warning("the workers' nodes are unknown: the shared-folder check of %s is skipped",
                           self.cfg.save_path)
            return
        Path(self.cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        timeout = min(self.cfg.step_timeout or FS_CHECK_TIMEOUT_S, FS_CHECK_TIMEOUT_S)
        check_shared_folders([self.cfg.save_path, self.cfg.checkpoint_dir], node_ids, node_labels(ray.nodes()),
                             ray.get_runtime_context().get_node_id(), timeout_s=timeout)

    # ------------------------------------------------------------------------------------------------ loop
    def fit(self) -> list[list[dict[str, Any]]]:
        """Train until ``max_steps`` or the end of the last episode; returns the per-step metric records."""
        self.setup()
        cfg = self.cfg
        if self.evaluator is not None and cfg.eval_before_training and self.step == 0:
            self.evaluate()
        while self.step < self.total_steps:
            records = self._guard(self.train_one_step, f"step {self.step + 1}")
            step = self.step
            if step % cfg.logging_steps == 0 or step == self.total_steps:
                self.metrics.log_step(step, records)
            self.metrics.advance(records)
            if self.evaluator is not None and cfg.eval_steps > 0 and step % cfg.eval_steps == 0:
                self.evaluate()
            if cfg.save_steps > 0 and step % cfg.save_steps == 0:
                self.save_checkpoint()
        if self.evaluator is not None and (not self.eval_history or self.eval_history[-1][0]["step"] != self.step):
            self.evaluate()
        if cfg.save_final_checkpoint and (self.last_checkpoint is None
                                          or not self.last_checkpoint.name.endswith(f"step{self.step}")):
            self.save_checkpoint()
        if cfg.save_hf:
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
        cfg = self.cfg
        return SamplingConfig(n=cfg.n_samples_per_prompt, temperature=cfg.temperature, top_p=cfg.top_p,
                              top_k=cfg.top_k, max_new_tokens=cfg.generate_max_len,
                              seed=derive_seed(cfg.seed, "rollout", step, agent))

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
            check_mismatch(step, rollouts, cfg.resolved_agents(), cfg)  # a broken weight sync stops here
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
            if cfg.save_rollouts:  # after training: with old_logp_from_update the learners scored them
                self.store.dump_jsonl(step, Path(cfg.save_path) / "rollouts" / f"step_{step:06d}.jsonl")

            # 5) weight sync to the rollout engines
            sync_s = [g.sync_weights() for g in self.groups]
        self.step = step

        summary = self.store.summary(step)
        names = [g.name for g in self.groups]
        # the driver's waits of this step: for its own batch (generated now) or for the next one (generated meanwhile)
        waited = batch.phases if generated_now else self.in_flight.phases if self.in_flight is not None else {}
        phases = {"rollout_phase": 0.0, "reward": 0.0, **timer.seconds, **waited}
        records = [agent_step_record(step, k, names, summary[k], [t for t in trajectories if t.source == k],
                                     capability, ratios, rollout, result, phases, sync_s[k],
                                     staleness=[versions[k] - t.policy_version for t in self._rows_of(k, trajectories)])
                   for k, (rollout, result) in enumerate(zip(rollouts, trained))]
        for record, mismatch in zip(records, mismatch_metrics(rollouts, names, cfg.algo.trains_on_foreign)):
            record.update(mismatch)
        self.history.append(records)
        return records

    def _rows_of(self, learner: int, trajectories: Sequence[Any]) -> list[Any]:
        """The trajectories learner ``learner`` trains on: every agent's (``hacpo``, ``naive``) or its own."""
        if self.cfg.algo.trains_on_foreign:
            return list(trajectories)
        return [t for t in trajectories if t.source == learner]

    def _start_rollouts(self, step: int, prompts: Sequence[Any],
                        rendered: Sequence[Any] | None = None) -> list[Pending]:
        """Every agent's rollout of ``prompts`` for ``step``, started (``rendered``: each agent's rendering)."""
        rendered = rendered if rendered is not None else [None] * len(self.groups)
        return [g.rollout(prompts, self.sampling_for(step, g.name), step, rendered=r)
                for g, r in zip(self.groups, rendered)]

    def _finish_rollouts(self, step: int, pendings: Sequence[Pending]) -> GeneratedBatch:
        """Wait for the rollouts (the ``rollout_phase``), verify every trajectory once (``reward``)."""
        timer = PhaseTimer()
        with timer.phase("rollout_phase"):
            rollouts: list[RolloutResult] = wait_all(pendings)
        batch = GeneratedBatch(step=step, rollouts=rollouts)
        with timer.phase("reward"):
            try:
                self.reward_runner.score_trajectories(batch.trajectories)
            except RewardFunctionError as err:
                raise RewardFunctionError(f"step {step}: {err}") from err
        batch.phases = dict(timer.seconds)
        return batch

    def _generate(self, step: int, prompts: Sequence[Any]) -> GeneratedBatch:
        """1) rollouts of every agent on the same prompts, concurrently; 2) one verification per trajectory."""
        return self._finish_rollouts(step, self._start_rollouts(step, prompts))

    def _shared(self, trajectories: list[Any]) -> Any:
        """The step's trajectories as every learner receives them: with Ray one copy in the object store."""
        if not self.cfg.use_ray:
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
        overlap = cfg.one_step_off and step < self.total_steps
        rendered: list[Any] | None = None
        if overlap:
            prompts = self.dataloader.next_batch()
            rendered = wait_all([g.render_for_rollout(prompts) for g in self.groups])
        with timer.phase("train_phase"):
            shared = self._shared(trajectories)
            if not cfg.old_logp_from_update:
                training = [g.train_step(shared, step, ratios) for g in self.groups]
                generating = self._start_rollouts(step + 1, prompts, rendered) if overlap else None
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
        next_batch = self._finish_rollouts(step + 1, generating) if generating is not None else None
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
            "seed": self.cfg.seed,
            "fingerprint": self.fingerprint,
            # --one_step_off: the next step's batch, generated by weights no checkpoint keeps
            **({"in_flight": self.in_flight.state_dict()} if self.in_flight is not None else {}),
        }

    def save_checkpoint(self) -> Path:
        """Write the joint checkpoint of the current step (atomic; old ones pruned to ``max_ckpt_num``).

        It counts (moved into place, named by ``latest``, older ones pruned, announced in the log) only once every
        file every rank of every agent wrote has been verified from the driver
        (:func:`~openrlhf_hacpo.trainer.checkpoint.verify_saved_files`); a failed save is removed on every node."""
        manifests: dict[str, list[dict[str, Any]]] = {}

        def write_agents(tmp: Path) -> dict[str, list[dict[str, Any]]]:
            pendings = [g.save_checkpoint(str(CheckpointManager.agent_dir(tmp, g.name))) for g in self.groups]
            for group, ranks in zip(self.groups, wait_all(pendings)):
                manifests[group.name] = [{**rank, "node": self._rank_node(group.name, rank.get("rank"))}
                                         for rank in ranks]
            return manifests

        self.last_checkpoint = self._guard(
            lambda: self.ckpt.save(self.step, self.trainer_state(), write_agents, self._first_checkpoint_size(),
                                   on_failure=self._remove_on_worker_nodes),
            f"saving the checkpoint of step {self.step}")
        files = sum(len(rank.get("files") or {}) for ranks in manifests.values() for rank in ranks)
        logger.info("saved joint checkpoint %s (%d files of %d ranks verified)", self.last_checkpoint, files,
                    sum(map(len, manifests.values())))
        return self.last_checkpoint

    def _rank_node(self, agent: str, rank: int | None) -> str | None:
        """How errors name the node of ``agent``'s policy ``rank`` (from the placement records), None if unknown."""
        entries = self.placement.get(agent, {}).get("policy") or []
        entry = next((e for e in entries if e.get("rank") == rank), None)
        if entry is None:
            return None
        return self.node_labels.get(entry["node_id"], entry.get("address"))

    def _remove_on_worker_nodes(self, path: Path) -> None:
        """Remove ``path`` in the view of every node hosting a worker other than the driver's (a failed save's
        temporary folder, which the driver has removed in its own view)."""
        nodes = worker_node_ids(self.placement)
        if not (self.cfg.use_ray and nodes):
            return
        import ray

        driver = ray.get_runtime_context().get_node_id()
        remove_on_nodes({node: [str(path)] for node in nodes if node != driver})

    def _first_checkpoint_size(self) -> int:
        """Estimated bytes of a joint checkpoint: per agent, its model files × 3 (weights and Adam's two moments,
        in the dtype the files hold; fp32 master weights of bf16 runs add one more copy)."""
        total = 0
        for agent in self.cfg.resolved_agents():
            if os.path.isdir(agent.pretrain):
                weights = sum(os.path.getsize(os.path.join(agent.pretrain, f)) for f in os.listdir(agent.pretrain)
                              if f.endswith((".safetensors", ".bin")))
                total += weights * (4 if agent.bf16 else 3)
        return total

    def _resume(self) -> None:
        checkpoint, state = self._resume_state
        self._guard(lambda: wait_all([g.load_checkpoint(str(CheckpointManager.agent_dir(checkpoint, g.name)))
                                      for g in self.groups]), f"loading checkpoint {checkpoint}")
        self.step = int(state["step"])
        self.dataloader.load_state_dict(state["dataloader"])
        self.tracker.load_state_dict(state["tracker"])
        restore_rng_state(state["rng"])
        self.last_checkpoint = checkpoint
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
        paths = [str(Path(self.cfg.save_path) / "hf" / g.name) for g in self.groups]
        self._guard(lambda: wait_all([g.save_hf(p) for g, p in zip(self.groups, paths)]), "saving HF checkpoints")
        return paths

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
        if self._started_ray:
            import ray

            attempt(ray.shutdown)
            self._started_ray = False
        attempt(self.lock.release)
        if self._log_handler is not None:
            logging.getLogger("openrlhf_hacpo").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None


def _ray_process_ids() -> list[int]:
    """Pids of the processes this driver has started (Ray's GCS, raylet, workers ...), for the run lock."""
    import psutil

    try:
        return [child.pid for child in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []
