"""The run folder (``--save_path``): never overwritten by accident, owned by one driver at a time.

* :func:`check_run_folder` refuses a fresh run (no ``--resume``) in a folder that already holds a run's outputs
  (``metrics.jsonl``, ``eval.jsonl``, checkpoints, ``hf/``, ``rollouts/``); ``--overwrite`` deletes those outputs
  first. Other files in the folder are left alone, and ``train.log`` is appended to.
* :class:`RunLock` writes ``.run.lock`` (driver host and pid, a heartbeat the driver refreshes every
  ``heartbeat_s`` = 30 s from a daemon thread, the pids of the Ray processes the driver started), always atomically.
  A lock whose heartbeat is fresh (younger than ``stale_after_s`` = 180 s) is another run in progress, on this host
  or another one sharing the folder: refused, naming its host, pid and last heartbeat. A lock whose driver is gone
  (its pid dead on this host) is taken at once; a lock with a stale heartbeat is taken over with a warning (a driver
  on a lost host, or one stopped for minutes). The heartbeat compares clocks of different hosts: keep them
  synchronised (NTP) well within ``stale_after_s``. When an earlier driver on this host is gone, the processes it
  recorded that are still alive are listed in a warning. :func:`lock_verdict` is the decision, on its own.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import secrets
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.utils.atomic import atomic_write_json
from openrlhf_hacpo.utils.errors import RunFolderError

__all__ = ["HEARTBEAT_S", "LOCK_FILE", "RUN_OUTPUTS", "STALE_AFTER_S", "LockVerdict", "RunLock", "check_run_folder",
           "lock_verdict", "run_outputs"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
HEARTBEAT_S = 30.0
"""Seconds between two refreshes of a held lock's heartbeat."""
STALE_AFTER_S = 180.0
"""A lock whose heartbeat is older than this (six missed refreshes) is taken over by the next driver."""
# train.log is not listed: it is only ever appended to, so a new run in the folder loses nothing of it
RUN_OUTPUTS = ("metrics.jsonl", "eval.jsonl", "checkpoints", "hf", "rollouts")


def run_outputs(cfg: TrainConfig) -> list[Path]:
    """Outputs of an earlier run present in the run folder (and a separate checkpoint folder), sorted."""
    root = Path(cfg.outputs.save_path)
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
    if cfg.outputs.resume:
        return
    found = run_outputs(cfg)
    if not found:
        return
    names = ", ".join(str(p) for p in found)
    if not overwrite:
        raise RunFolderError(f"save path {cfg.outputs.save_path} already holds a run ({names}); continue it with "
                             "--resume, or start over with --overwrite (deletes those outputs)")
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


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


@dataclass(frozen=True)
class LockVerdict:
    """What a driver does with the lock it found: ``take`` (free, its own, or its driver is gone), ``take_over``
    (stale: taken with a warning, ``reason``) or ``refuse`` (another run is using the folder: ``reason`` is the
    error)."""

    action: str
    reason: str = ""


def lock_verdict(earlier: Mapping[str, Any] | None, now: float, host: str, pid: int, alive: Callable[[int], bool],
                 lock_path: str, stale_after_s: float = STALE_AFTER_S) -> LockVerdict:
    """Decide about the lock file content ``earlier`` (None: no lock; ``{}``: unreadable) found by driver ``pid``
    on ``host`` at time ``now`` (seconds since the epoch); ``alive`` tells whether a pid of this host is alive."""
    if earlier is None:
        return LockVerdict("take")
    if not earlier:
        return LockVerdict("take_over", f"{lock_path} cannot be read; taking it over")
    their_pid, their_host = earlier.get("pid"), earlier.get("host")
    if their_host == host and their_pid == pid:
        return LockVerdict("take")
    beat = earlier.get("heartbeat")
    age = now - float(beat) if isinstance(beat, (int, float)) else None
    fresh = age is not None and age <= stale_after_s
    if their_host == host and isinstance(their_pid, int) and not alive(their_pid):
        return LockVerdict("take")
    last = (f"last heartbeat {_when(float(beat))}, {max(age, 0.0):.0f} s ago" if age is not None else
            "no heartbeat recorded")
    who = f"driver pid {their_pid} on host {their_host}, started {earlier.get('started', '?')}, {last}"
    if fresh or (age is None and their_host == host):
        return LockVerdict("refuse", (
            f"another run ({who}) is using {Path(lock_path).parent}; wait for it or stop it first. If that driver is "
            f"gone (its host lost), remove {lock_path} to go on; a lock whose heartbeat is older than "
            f"{stale_after_s:.0f} s is taken over automatically"))
    why = ("its heartbeat is stale: that driver is gone or stopped" if age is not None else
           "it records no heartbeat and was written on another host")
    return LockVerdict("take_over", f"taking over the run lock {lock_path} ({who}): {why}")


class RunLock:
    """``<save_path>/.run.lock`` for the lifetime of a driver, refreshed by a heartbeat thread while held.

    Args:
        save_path: the run folder.
        clock: seconds since the epoch (injected by tests).
        heartbeat_s: seconds between heartbeats; stale_after_s: heartbeat age after which a lock is taken over.
    """

    def __init__(self, save_path: str, clock: Callable[[], float] = time.time, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S) -> None:
        self.path = Path(save_path) / LOCK_FILE
        self.clock, self.heartbeat_s, self.stale_after_s = clock, heartbeat_s, stale_after_s
        self.held = False
        self.leftovers: list[int] = []
        self.token = secrets.token_hex(8)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        self.processes: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock (see :func:`lock_verdict`) and start the heartbeat.

        Raises:
            RunFolderError: another run holds the lock (fresh heartbeat, or a live driver pid on this host).
        """
        host = socket.gethostname()
        for _ in range(3):
            earlier = self._read()
            verdict = lock_verdict(earlier, self.clock(), host, os.getpid(), _alive, str(self.path),
                                   self.stale_after_s)
            if verdict.action == "refuse":
                raise RunFolderError(verdict.reason)
            if verdict.action == "take_over":
                logger.warning("%s", verdict.reason)
            if earlier:
                self._report_leftovers(earlier, host)
            if earlier is None:
                if not self._create():
                    continue  # another driver created it a moment ago: decide again
            else:
                self._write()
            if (self._read() or {}).get("token") == self.token:
                self.held = True
                self._start_heartbeat()
                return
        raise RunFolderError(f"could not take the run lock {self.path}: another driver is taking it at the same "
                             "time")

    def _report_leftovers(self, earlier: Mapping[str, Any], host: str) -> None:
        pid = earlier.get("pid")
        if earlier.get("host") != host or (isinstance(pid, int) and _alive(pid)):
            return
        self.leftovers = [p for p in earlier.get("processes", []) if isinstance(p, int) and _alive(p)]
        if self.leftovers:
            logger.warning("an earlier run in %s (driver pid %s) ended without shutting down; its processes %s are "
                           "still alive (stop them with: kill %s)", self.path.parent, pid, self.leftovers,
                           " ".join(map(str, self.leftovers)))

    def record_processes(self, pids: Sequence[int]) -> None:
        """Remember the processes this driver started (e.g. Ray's), for the stale-process check of a later run."""
        if self.held:
            self.processes = sorted({int(p) for p in pids})
            self._write()

    def heartbeat(self) -> bool:
        """Refresh the heartbeat now; False (and an error logged) when the lock is no longer this driver's (taken
        over by another driver while this one did not refresh it)."""
        current = self._read()
        if not current or current.get("token") != self.token:
            logger.error("the run lock %s was taken over by %s; this run no longer holds %s", self.path,
                         f"driver pid {current.get('pid')} on host {current.get('host')}" if current else
                         "nobody (it was removed)", self.path.parent)
            return False
        self._write()
        return True

    def release(self) -> None:
        """Stop the heartbeat and remove the lock (only if it is still this driver's)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.held:
            if (self._read() or {}).get("token") == self.token:
                self.path.unlink(missing_ok=True)
            self.held = False

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.heartbeat():
                    return
            except OSError as err:  # a file system hiccup: try again at the next beat
                logger.warning("could not refresh the run lock %s: %s", self.path, err)

    def _content(self) -> dict[str, Any]:
        now = self.clock()
        return {"pid": os.getpid(), "host": socket.gethostname(), "started": self.started, "heartbeat": now,
                "heartbeat_utc": _when(now), "token": self.token, "processes": self.processes}

    def _read(self) -> dict[str, Any] | None:
        """The lock's content; None when there is no lock, ``{}`` when it cannot be read."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self) -> None:
        atomic_write_json(self.path, self._content())

    def _create(self) -> bool:
        """Create the lock only if none exists (a hard link of a complete temporary file); False if one does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._content(), f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError:  # a file system without hard links: exclusive creation instead
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(self._content(), f, indent=2)
            return True
        finally:
            os.unlink(tmp)
