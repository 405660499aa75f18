"""The run folder (``--save_path``): never overwritten by accident, owned by one driver at a time.

* :func:`check_run_folder` refuses a fresh run (no ``--resume``) in a folder that already holds a run's outputs
  (``metrics.jsonl``, ``eval.jsonl``, checkpoints, ``hf/``, ``rollouts/``); ``--overwrite`` deletes those outputs
  first. Other files in the folder are left alone, and ``train.log`` is appended to.
* :class:`RunLock` writes ``.run.lock`` (driver pid, host, the pids of the Ray processes the driver started). A lock
  whose driver is alive on this host is another run in progress: refused. A lock whose driver is gone is an earlier
  run that did not shut down cleanly: the processes it recorded that are still alive are listed in a warning.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.utils.atomic import atomic_write_json
from openrlhf_hacpo.utils.errors import RunFolderError

__all__ = ["LOCK_FILE", "RUN_OUTPUTS", "RunLock", "check_run_folder", "run_outputs"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
# train.log is not listed: it is only ever appended to, so a new run in the folder loses nothing of it
RUN_OUTPUTS = ("metrics.jsonl", "eval.jsonl", "checkpoints", "hf", "rollouts")


def run_outputs(cfg: TrainConfig) -> list[Path]:
    """Outputs of an earlier run present in the run folder (and a separate checkpoint folder), sorted."""
    root = Path(cfg.save_path)
    found = [root / name for name in RUN_OUTPUTS if (root / name).exists() and not _empty_dir(root / name)]
    ckpt = Path(cfg.checkpoint_dir)
    if ckpt.exists() and not _empty_dir(ckpt) and ckpt not in found:
        found.append(ckpt)
    return sorted(found)


def check_run_folder(cfg: TrainConfig, overwrite: bool = False) -> None:
    """Refuse (or, with ``overwrite``, clear) a run folder holding an earlier run, unless the run resumes it.

    Raises:
        RunFolderError: the folder holds a run, and neither ``--resume`` nor ``--overwrite`` is given.
    """
    if cfg.resume:
        return
    found = run_outputs(cfg)
    if not found:
        return
    names = ", ".join(str(p) for p in found)
    if not overwrite:
        raise RunFolderError(f"save path {cfg.save_path} already holds a run ({names}); continue it with --resume, "
                             "or start over with --overwrite (deletes those outputs)")
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    logger.warning("--overwrite: deleted the earlier run's outputs %s", names)


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """``<save_path>/.run.lock`` for the lifetime of a driver.

    Args:
        save_path: the run folder.
    """

    def __init__(self, save_path: str) -> None:
        self.path = Path(save_path) / LOCK_FILE
        self.held = False
        self.leftovers: list[int] = []

    def acquire(self) -> None:
        """Take the lock; an earlier live driver is an error, a dead one's surviving processes a warning."""
        if self.path.exists():
            try:
                earlier = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                earlier = {}
            pid, host = earlier.get("pid"), earlier.get("host")
            if isinstance(pid, int) and host == socket.gethostname() and pid != os.getpid() and _alive(pid):
                raise RunFolderError(f"another run (driver pid {pid}, started {earlier.get('started', '?')}) is "
                                     f"using {self.path.parent}; wait for it or stop it first")
            self.leftovers = [p for p in earlier.get("processes", []) if isinstance(p, int) and _alive(p)]
            if self.leftovers and host == socket.gethostname():
                logger.warning("an earlier run in %s (driver pid %s) ended without shutting down; its processes %s are "
                               "still alive (stop them with: kill %s)", self.path.parent, pid, self.leftovers,
                               " ".join(map(str, self.leftovers)))
        self._write([])
        self.held = True

    def record_processes(self, pids: Sequence[int]) -> None:
        """Remember the processes this driver started (e.g. Ray's), for the stale-process check of a later run."""
        if self.held:
            self._write(sorted({int(p) for p in pids}))

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def _write(self, processes: list[int]) -> None:
        atomic_write_json(self.path, {"pid": os.getpid(), "host": socket.gethostname(),
                                      "started": time.strftime("%Y-%m-%d %H:%M:%S"), "processes": processes})
