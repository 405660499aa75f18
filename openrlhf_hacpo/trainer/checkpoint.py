"""Joint checkpoints: every agent's training state plus the controller's, written atomically.

Layout under the checkpoint folder (``--ckpt_path``, default ``<save_path>/checkpoints``)::

    global_step4/
        trainer_state.pt      step, data-loader cursor, capability tracker, driver RNG states, counters
        trainer_state.json    the same facts that are JSON-safe (for people and tools)
        agents/<name>/        each agent's DeepSpeed checkpoint (weights, optimizer, lr scheduler) + worker RNG
    latest                    "global_step4"

A checkpoint folder is built under a temporary name and renamed into place only when every agent has written its
part (:func:`openrlhf_hacpo.utils.atomic.atomic_dir`); ``latest`` is replaced atomically afterwards. A save killed
half-way therefore leaves the previous checkpoint and ``latest`` untouched. Only the newest ``max_keep`` checkpoints
are kept.
"""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from openrlhf_hacpo.utils.atomic import atomic_dir, atomic_write_text

__all__ = ["CheckpointManager", "capture_rng_state", "restore_rng_state"]

_STEP_DIR = re.compile(r"^global_step(\d+)$")
STATE_FILE = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
LATEST = "latest"


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointManager:
    """Writes, finds and prunes joint checkpoints in ``root``."""

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

    def latest(self) -> Path | None:
        """The checkpoint named by ``latest`` (or the newest complete one), None when there is none."""
        pointer = self.root / LATEST
        if pointer.is_file():
            candidate = self.root / pointer.read_text(encoding="utf-8").strip()
            if (candidate / STATE_FILE).is_file():
                return candidate
        steps = self.steps()
        return self.path_for(steps[-1]) if steps else None

    def save(self, step: int, trainer_state: dict[str, Any], write_agents: Callable[[Path], None]) -> Path:
        """Write checkpoint ``step``: ``write_agents(tmp_dir)`` stores every agent's part under ``tmp_dir/agents``.

        Returns the final folder.
        """
        final = self.path_for(step)
        with atomic_dir(final) as tmp:
            (tmp / "agents").mkdir()
            write_agents(tmp)
            torch.save(trainer_state, tmp / STATE_FILE)
            summary = {k: v for k, v in trainer_state.items() if _json_ok(v)}
            (tmp / STATE_JSON).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        atomic_write_text(self.root / LATEST, final.name + "\n")
        self._prune()
        return final

    def load_trainer_state(self, checkpoint: Path) -> dict[str, Any]:
        path = Path(checkpoint) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {checkpoint} has no {STATE_FILE}")
        return torch.load(path, weights_only=False)

    def _prune(self) -> None:
        steps = self.steps()
        for step in steps[: max(len(steps) - self.max_keep, 0)]:
            shutil.rmtree(self.path_for(step), ignore_errors=True)


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False
