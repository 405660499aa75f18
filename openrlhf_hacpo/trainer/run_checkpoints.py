"""A run's folder and its joint checkpoints, for the controller: :class:`RunCheckpoints` takes the run lock, checks
(or, with ``--overwrite``, clears) the folder, logs into it and on ``--resume`` reads and checks the latest checkpoint
before any worker starts; it writes a joint checkpoint of every agent's ranks (verified from the driver, moved into
place atomically, :class:`~openrlhf_hacpo.trainer.checkpoint.CheckpointManager`), loads the agents' parts back, and
writes the per-agent Hugging Face exports.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.trainer.checkpoint import CheckpointManager
from openrlhf_hacpo.trainer.fingerprint import fingerprint_differences
from openrlhf_hacpo.trainer.run_cluster import RunCluster
from openrlhf_hacpo.trainer.run_folder import RunLock, check_run_folder, run_outputs
from openrlhf_hacpo.utils.errors import CheckpointError, RunFolderError
from openrlhf_hacpo.utils.logging_setup import LOG_FILE, attach_run_log

__all__ = ["RunCheckpoints", "check_resume_settings"]

logger = logging.getLogger(__name__)


def check_resume_settings(checkpoint: Path, state: Mapping[str, Any], fingerprint: Mapping[str, Any],
                          accept_mismatch: bool) -> list[str]:
    """``--resume``'s check of the settings: the checkpoint's trainer state (``trainer_state.pt``, whose JSON-safe
    part ``trainer_state.json`` holds the same fingerprint) against this run's config fingerprint
    (:func:`~openrlhf_hacpo.trainer.fingerprint.config_fingerprint`). A difference raises ``CheckpointError`` naming
    each changed setting, unless ``accept_mismatch`` (``--resume_accept_mismatch``): then it is logged. Returns the
    differences."""
    stored = state.get("fingerprint")
    differences = fingerprint_differences(stored, dict(fingerprint)) if stored is not None else []
    if differences and not accept_mismatch:
        raise CheckpointError(f"checkpoint {checkpoint} was written with other settings; resume with the same "
                              "settings, or pass --resume_accept_mismatch to continue with the new ones: "
                              + "; ".join(differences))
    if differences:
        logger.warning("--resume_accept_mismatch: continuing %s with changed settings: %s", checkpoint,
                       "; ".join(differences))
    return differences


def _wait_all(pendings: Sequence[Any]) -> list[Any]:
    return [p.result() for p in pendings]


class RunCheckpoints:
    """The run folder (lock, log) and joint checkpoints of one run.

    Attributes:
        ckpt: the checkpoint folder's manager.
        lock: the run folder's lock.
        last_checkpoint: the newest complete checkpoint of this run (written or resumed from), None before one.
        resume_state: ``--resume``: the checkpoint to resume and its trainer state, read by :meth:`prepare`.
        run_log: ``<save_path>/train.log`` once this run logs there.
    """

    def __init__(self, cfg: TrainConfig, fingerprint: dict[str, Any], cluster: RunCluster, lock: RunLock) -> None:
        self.cfg = cfg
        self.fingerprint = fingerprint
        self.cluster = cluster
        self.ckpt = CheckpointManager(cfg.checkpoint_dir, max_keep=cfg.outputs.max_ckpt_num)
        self.lock = lock
        self.last_checkpoint: Path | None = None
        self.resume_state: tuple[Path, dict[str, Any]] | None = None
        self.run_log: Path | None = None
        self._log_handler: logging.Handler | None = None

    def prepare(self) -> None:
        """Take the run lock, refuse or clear an earlier run's outputs, remove stale save leftovers, log to the
        folder; on ``--resume`` read and check the trainer state now, before any worker starts. The lock comes first:
        a run still using the folder refuses this driver before ``--overwrite`` deletes anything."""
        cfg = self.cfg
        self.lock.acquire()
        check_run_folder(cfg, cfg.outputs.overwrite)
        self._log_handler = attach_run_log(cfg.outputs.save_path)
        self.run_log = Path(cfg.outputs.save_path) / LOG_FILE
        self.ckpt.clean_stale()
        if not cfg.outputs.resume:
            return
        checkpoint = self.ckpt.latest()
        if checkpoint is None:
            outputs = run_outputs(cfg)
            if outputs:
                raise RunFolderError(f"--resume: no checkpoint under {cfg.checkpoint_dir}, but "
                                     f"{cfg.outputs.save_path} holds a run's outputs ({', '.join(map(str, outputs))}) "
                                     "that a fresh start would replace; start over with --overwrite instead of "
                                     "--resume")
            logger.warning("--resume: no checkpoint under %s, starting from scratch", cfg.checkpoint_dir)
            return
        state = self.ckpt.load_trainer_state(checkpoint)
        if state.get("agents") != cfg.agent_names:
            raise ValueError(f"checkpoint {checkpoint} holds agents {state.get('agents')}, this run has "
                             f"{cfg.agent_names}")
        self.ckpt.check_complete(checkpoint, cfg.agent_names)
        check_resume_settings(checkpoint, state, self.fingerprint, cfg.outputs.resume_accept_mismatch)
        self.resume_state = (checkpoint, state)

    def save(self, step: int, trainer_state: dict[str, Any], groups: Sequence[Any]) -> Path:
        """Write the joint checkpoint of ``step`` (atomic; old ones pruned to ``max_ckpt_num``).

        It counts (moved into place, named by ``latest``, older ones pruned, announced in the log) only once every
        file every rank of every agent wrote has been verified from the driver
        (:func:`~openrlhf_hacpo.trainer.checkpoint.verify_saved_files`); a failed save is removed on every node."""
        manifests: dict[str, list[dict[str, Any]]] = {}

        def write_agents(tmp: Path) -> dict[str, list[dict[str, Any]]]:
            pendings = [g.save_checkpoint(str(CheckpointManager.agent_dir(tmp, g.name))) for g in groups]
            for group, ranks in zip(groups, _wait_all(pendings)):
                manifests[group.name] = [{**rank, "node": self.cluster.rank_node(group.name, rank.get("rank"))}
                                         for rank in ranks]
            return manifests

        self.last_checkpoint = self.ckpt.save(step, trainer_state, write_agents, self.first_checkpoint_size(),
                                              on_failure=self.cluster.remove_on_worker_nodes)
        files = sum(len(rank.get("files") or {}) for ranks in manifests.values() for rank in ranks)
        logger.info("saved joint checkpoint %s (%d files of %d ranks verified)", self.last_checkpoint, files,
                    sum(map(len, manifests.values())))
        return self.last_checkpoint

    def first_checkpoint_size(self) -> int:
        """Estimated bytes of a joint checkpoint: per agent, its model files × 3 (weights and Adam's two moments,
        in the dtype the files hold; fp32 master weights of bf16 runs add one more copy)."""
        total = 0
        for agent in self.cfg.resolved_agents:
            if os.path.isdir(agent.pretrain):
                weights = sum(os.path.getsize(os.path.join(agent.pretrain, f)) for f in os.listdir(agent.pretrain)
                              if f.endswith((".safetensors", ".bin")))
                total += weights * (4 if agent.bf16 else 3)
        return total

    def load_agents(self, groups: Sequence[Any], guard: Callable[[Callable[[], Any], str], Any]) -> dict[str, Any]:
        """Every agent's ranks load their part of the checkpoint :meth:`prepare` chose (``guard`` names a worker
        that dies); returns the trainer state stored with it."""
        checkpoint, state = self.resume_state
        guard(lambda: _wait_all([g.load_checkpoint(str(CheckpointManager.agent_dir(checkpoint, g.name)))
                                 for g in groups]), f"loading checkpoint {checkpoint}")
        self.last_checkpoint = checkpoint
        return state

    def save_hf(self, groups: Sequence[Any], guard: Callable[[Callable[[], Any], str], Any]) -> list[str]:
        """Per-agent Hugging Face checkpoints under ``<save_path>/hf/<agent>/`` (``guard`` names a worker that
        dies); returns the folders."""
        paths = [str(Path(self.cfg.outputs.save_path) / "hf" / g.name) for g in groups]
        guard(lambda: _wait_all([g.save_hf(p) for g, p in zip(groups, paths)]), "saving HF checkpoints")
        return paths

    def close(self) -> None:
        """Stop logging into the run folder."""
        if self._log_handler is not None:
            logging.getLogger("openrlhf_hacpo").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
