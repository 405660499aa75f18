"""Joint checkpoints: every agent's training state plus the controller's, written atomically.

Layout under the checkpoint folder (``--ckpt_path``, default ``<save_path>/checkpoints``)::

    global_step4/
        trainer_state.pt      step, data-loader cursor, capability tracker, driver RNG states, config fingerprint,
                              and with --one_step_off the next step's batch (generated, scored, verified)
        trainer_state.json    the same facts that are JSON-safe (for people and tools)
        agents/<name>/        each agent's DeepSpeed checkpoint (weights, optimizer, lr scheduler) + worker RNG
    latest                    "global_step4"

A checkpoint folder is built under a temporary name, its files are fsynced, and it is renamed into place only when
every agent has written its part (:func:`openrlhf_hacpo.utils.atomic.atomic_dir`) and every file each rank of each
agent reports writing has been verified from the driver (:func:`verify_saved_files`: present, the size the rank
wrote, readable); ``latest`` is replaced atomically afterwards, and older checkpoints are pruned only then. A file
the driver cannot see (a rank whose node writes into a folder that is not shared) fails the save with an error
naming the agent, the rank, its node and the file, and leaves the previous checkpoint as the latest. A save killed half-way therefore leaves the previous checkpoint and ``latest`` untouched, and the
temporary folder it leaves behind is removed by :meth:`CheckpointManager.clean_stale` at the next start. Only the
newest ``max_keep`` checkpoints are kept, and the one just written is never pruned.

Before writing, the free space is compared with an estimate of the checkpoint's size (the size of the newest
checkpoint, or the caller's estimate for the first one); a write that fails on a full disk says "no space left on
device" with the path. Every file of the checkpoint that this project writes holds only tensors and plain
containers and is loaded with ``torch.load(weights_only=True)`` (:func:`openrlhf_hacpo.utils.safe_load.load_torch_file`).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from openrlhf_hacpo.utils.atomic import atomic_dir, atomic_write_text
from openrlhf_hacpo.utils.disk import ensure_free_space, explain_write_error, folder_size
from openrlhf_hacpo.utils.errors import CheckpointError
from openrlhf_hacpo.utils.safe_load import load_torch_file

__all__ = ["CheckpointManager", "verify_saved_files"]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^global_step(\d+)$")
# leftovers of an interrupted atomic_dir / atomic write: ".global_step4.<random>.tmp", ".global_step4.old-<random>",
# ".latest.<random>.tmp"
_STALE_TMP = re.compile(r"^\.(global_step\d+|latest)\..+\.tmp$")
_STALE_OLD = re.compile(r"^\.(global_step\d+)\.old-.+$")
STATE_FILE = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
LATEST = "latest"
# trainer-state entries too large for the JSON summary: the batch in flight (--one_step_off, trainer/in_flight.py)
_NOT_SUMMARISED = frozenset({"in_flight"})
# head room kept free on top of the estimated checkpoint size
_SPACE_MARGIN = 1.1


class CheckpointManager:
    """Writes, finds, validates and prunes joint checkpoints in ``root``."""

    def __init__(self, root: str, max_keep: int = 3) -> None:
        if max_keep < 1:
            raise ValueError(f"max_keep must be >= 1, got {max_keep}")
        self.root = Path(root)
        self.max_keep = max_keep

    @staticmethod
    def agent_dir(checkpoint: Path, agent_name: str) -> Path:
        return Path(checkpoint) / "agents" / agent_name

    def path_for(self, step: int) -> Path:
        return self.root / f"global_step{step}"

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints present, ascending."""
        if not self.root.is_dir():
            return []
        out = []
        for child in self.root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and (child / STATE_FILE).is_file():
                out.append(int(match.group(1)))
        return sorted(out)

    def latest(self, agents: Sequence[str] = ()) -> Path | None:
        """The checkpoint named by ``latest``, the newest complete one when there is no ``latest``, or None.

        Raises:
            CheckpointError: ``latest`` exists but does not name a complete checkpoint folder inside ``root``
                (dangling, pointing elsewhere, or missing the trainer state or an agent in ``agents``).
        """
        pointer = self.root / LATEST
        if pointer.is_file() or pointer.is_symlink():
            if pointer.is_symlink():
                raise CheckpointError(f"{pointer} is a symbolic link; it must be a file naming a checkpoint folder")
            try:
                name = pointer.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                raise CheckpointError(f"{pointer} cannot be read ({err})") from err
            if not _STEP_DIR.match(name):
                raise CheckpointError(f"{pointer} names {name!r}, not a checkpoint folder of {self.root} "
                                      "(expected global_step<N>); remove it or fix it to resume")
            candidate = self.root / name
            if not candidate.is_dir():
                raise CheckpointError(f"{pointer} names {name}, which does not exist in {self.root} (dangling); "
                                      f"complete checkpoints there: {self._listing()}")
            self.check_complete(candidate, agents)
            return candidate
        steps = self.steps()
        if not steps:
            return None
        candidate = self.path_for(steps[-1])
        logger.warning("%s has no %s file; using the newest complete checkpoint %s", self.root, LATEST, candidate)
        self.check_complete(candidate, agents)
        return candidate

    def check_complete(self, checkpoint: Path, agents: Sequence[str] = ()) -> None:
        """Raise :class:`CheckpointError` unless ``checkpoint`` holds the trainer state and every agent's folder."""
        if not (Path(checkpoint) / STATE_FILE).is_file():
            raise CheckpointError(f"checkpoint {checkpoint} is incomplete: it has no {STATE_FILE}")
        for name in agents:
            if not self.agent_dir(checkpoint, name).is_dir():
                raise CheckpointError(f"checkpoint {checkpoint} has no state for agent {name!r} "
                                      f"(expected {self.agent_dir(checkpoint, name)})")

    def _latest_name(self) -> str:
        """The name ``latest`` holds, or "none"."""
        try:
            return (self.root / LATEST).read_text(encoding="utf-8").strip() or "none"
        except (OSError, UnicodeDecodeError):
            return "none"

    def _listing(self) -> str:
        steps = self.steps()
        return ", ".join(self.path_for(s).name for s in steps) if steps else "none"

    def clean_stale(self) -> list[Path]:
        """Remove what interrupted saves left in ``root``; returns the removed paths.

        ``.<name>.<random>.tmp`` entries are half-written and always removed. A ``.global_stepN.old-*`` folder is
        the previous version of ``global_stepN`` that a save killed between its two renames left aside: it is
        removed when ``global_stepN`` is complete, and renamed back otherwise (it is then the only copy).
        """
        if not self.root.is_dir():
            return []
        removed = []
        for child in sorted(self.root.iterdir()):
            if _STALE_TMP.match(child.name):
                _remove(child)
                removed.append(child)
                continue
            match = _STALE_OLD.match(child.name)
            if match:
                target = self.root / match.group(1)
                if (target / STATE_FILE).is_file():
                    _remove(child)
                    removed.append(child)
                elif not target.exists():
                    child.rename(target)
                    logger.warning("restored %s from %s (a save was interrupted between its renames)", target, child)
        for path in removed:
            logger.info("removed %s, left by an interrupted save", path)
        return removed

    def estimate_size(self, first_estimate: int = 0) -> int:
        """Bytes the next checkpoint will take: the newest checkpoint's size, else ``first_estimate``."""
        steps = self.steps()
        return folder_size(self.path_for(steps[-1])) if steps else first_estimate

    def save(self, step: int, trainer_state: dict[str, Any],
             write_agents: Callable[[Path], Mapping[str, Sequence[Mapping[str, Any]]] | None],
             size_estimate: int = 0, on_failure: Callable[[Path], None] | None = None) -> Path:
        """Write checkpoint ``step``: ``write_agents(tmp_dir)`` stores every agent's part under ``tmp_dir/agents``.

        Args:
            write_agents: writes the agents' parts; it may return, per agent, its ranks' manifests (the files each
                rank wrote, :func:`~openrlhf_hacpo.actors.checkpoint_files.rank_manifest`), which are verified
                (:func:`verify_saved_files`) before the checkpoint is moved into place.
            size_estimate: expected bytes of the first checkpoint (later ones use the previous checkpoint's size).
            on_failure: called with the temporary folder when the save fails (after the driver removed it), to
                remove what other nodes left in their own view of it.

        Returns the final folder.

        Raises:
            CheckpointError: a file a rank reports writing is missing, empty, of another size or unreadable here.
            DiskSpaceError: too little free space for the estimate, or a write that failed on a full disk.
        """
        final = self.path_for(step)
        self.root.mkdir(parents=True, exist_ok=True)
        ensure_free_space(self.root, int(self.estimate_size(size_estimate) * _SPACE_MARGIN),
                          f"checkpoint {final.name}")
        started: list[Path] = []
        try:
            with atomic_dir(final) as tmp:
                started.append(tmp)
                (tmp / "agents").mkdir()
                manifests = write_agents(tmp)
                if manifests is not None:
                    problems = verify_saved_files(tmp / "agents", manifests)
                    if problems:
                        previous = self._latest_name()
                        raise CheckpointError(
                            f"checkpoint {final.name} was not saved: " + "; ".join(problems) + ". The latest "
                            f"checkpoint stays {previous}" + ("" if previous != "none" else " (none yet)"))
                torch.save(trainer_state, tmp / STATE_FILE)
                summary = {k: v for k, v in trainer_state.items() if k not in _NOT_SUMMARISED and _json_ok(v)}
                (tmp / STATE_JSON).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n",
                                              encoding="utf-8")
            atomic_write_text(self.root / LATEST, final.name + "\n")
        except Exception as err:
            if started and on_failure is not None:
                try:
                    on_failure(started[0])
                except Exception as cleanup:  # noqa: BLE001 - the save's own error is the one to report
                    logger.warning("could not remove %s on every node: %s: %s", started[0], type(cleanup).__name__,
                                   cleanup)
            explained = explain_write_error(err, self.root, f"checkpoint {final.name}")
            if explained is not None:
                raise explained from err
            raise
        self._prune(keep=final)
        return final

    def load_trainer_state(self, checkpoint: Path) -> dict[str, Any]:
        """The trainer state of ``checkpoint`` (tensors and plain containers only)."""
        state = load_torch_file(Path(checkpoint) / STATE_FILE, f"the trainer state of checkpoint {checkpoint}")
        if not isinstance(state, dict) or "step" not in state:
            raise CheckpointError(f"{Path(checkpoint) / STATE_FILE} is not a trainer state (no 'step' entry)")
        return state

    def _prune(self, keep: Path) -> None:
        """Delete the oldest checkpoints beyond ``max_keep``; ``keep`` (the one just written) always stays."""
        others = [s for s in self.steps() if self.path_for(s) != keep]
        for step in others[: max(len(others) + 1 - self.max_keep, 0)]:
            shutil.rmtree(self.path_for(step), ignore_errors=True)


def verify_saved_files(agents_dir: Path, manifests: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Check, from this process, every file each rank of each agent reports writing under
    ``agents_dir/<agent>/``; returns one problem per bad file (empty: all present, of the size the rank wrote and
    readable).

    Args:
        manifests: per agent, one manifest per rank, :func:`~openrlhf_hacpo.actors.checkpoint_files.rank_manifest`
            (``rank``, ``host``, ``files``: relative path -> size on the rank's node, -1 when absent there), with an
            optional ``node`` (how to name the rank's node; ``host`` otherwise).
    """
    problems = []
    for agent, ranks in manifests.items():
        if not ranks:
            problems.append(f"agent {agent!r} reported no files")
        for manifest in ranks:
            who = (f"agent {agent!r} rank {manifest.get('rank', '?')} "
                   f"(node {manifest.get('node') or manifest.get('host', '?')})")
            files = manifest.get("files") or {}
            if not files:
                problems.append(f"{who} reported no files")
            for name, size in sorted(files.items()):
                path = Path(agents_dir) / agent / name
                problem = _file_problem(path, int(size))
                if problem:
                    problems.append(f"{who}: {name} {problem}")
    return problems


def _file_problem(path: Path, size: int) -> str | None:
    """What is wrong with ``path`` as the driver sees it, given the ``size`` its rank wrote (-1: absent there)."""
    if size < 0:
        return "was not found on the rank's own node after it wrote it"
    if size == 0:
        return "is empty on the rank's node"
    try:
        with open(path, "rb") as f:
            seen = os.fstat(f.fileno()).st_size
            f.read(1)
    except FileNotFoundError:
        return (f"({size} bytes on the rank's node) is missing here at {path}: the checkpoint folder is not shared "
                "with that node (it must be one shared folder on every node, docs/multinode.md)")
    except OSError as err:
        return f"cannot be read here at {path}: {err.strerror or err}"
    if seen != size:
        return f"has {seen} bytes here at {path}, {size} on the rank's node"
    return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False
