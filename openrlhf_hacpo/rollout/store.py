"""The shared rollout store: the step's verified trajectories of every agent, tokenizer-neutral.

The controller adds each step's trajectories here and reads back what the step needs from them: the rewards per
source agent (the capability tracker's input, eq. 9), the per-agent summary of the step's metrics record and, with
``--save_rollouts``, a JSON-lines dump of the step. Learners do not query the store: the controller hands every learner
the same list of the step's trajectories. The store keeps the last ``keep_last_steps`` steps (default 1; the
controller keeps 1) and is not part of the joint checkpoint: a resumed run starts from the next step's rollouts.
:meth:`RolloutStore.state_dict` / :meth:`RolloutStore.load_state_dict` are a JSON round trip of the held trajectories
that the trainer does not call.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from openrlhf_hacpo.rollout.trajectory import Trajectory
from openrlhf_hacpo.utils.atomic import atomic_write_text
from openrlhf_hacpo.utils.jsonl import iter_jsonl

__all__ = ["RolloutStore"]


class RolloutStore:
    """Trajectories grouped by training step, with per-step retention.

    Args:
        keep_last_steps: how many of the most recent steps to keep; older steps are evicted when a newer step is
            added. ``None`` keeps everything.
    """

    def __init__(self, keep_last_steps: int | None = 1) -> None:
        if keep_last_steps is not None and (not isinstance(keep_last_steps, int) or keep_last_steps < 1):
            raise ValueError(f"keep_last_steps must be a positive int or None, got {keep_last_steps!r}")
        self.keep_last_steps = keep_last_steps
        self._steps: dict[int, list[Trajectory]] = {}

    # ------------------------------------------------------------------------------------------------- writing
    def add(self, trajs: Iterable[Trajectory]) -> None:
        """Append trajectories (each goes to its own ``step``), then evict steps beyond the retention window."""
        for traj in trajs:
            if not isinstance(traj, Trajectory):
                raise TypeError(f"RolloutStore.add expects Trajectory objects, got {type(traj).__name__}")
            self._steps.setdefault(traj.step, []).append(traj)
        self._evict()

    def _evict(self) -> None:
        if self.keep_last_steps is None:
            return
        for step in sorted(self._steps)[: -self.keep_last_steps]:
            del self._steps[step]

    # ------------------------------------------------------------------------------------------------- reading
    @property
    def steps(self) -> list[int]:
        return sorted(self._steps)

    def __len__(self) -> int:
        return sum(len(v) for v in self._steps.values())

    def for_step(self, step: int) -> list[Trajectory]:
        """All trajectories of ``step`` in insertion order (a new list; the trajectories are shared)."""
        if step not in self._steps:
            raise KeyError(f"RolloutStore has no trajectories for step {step} (held steps: {self.steps})")
        return list(self._steps[step])

    def rewards_by_source(self, step: int, num_agents: int) -> list[list[float]]:
        """Verified rewards of ``step`` per source agent (index = agent), for the capability tracker (eq. 9)."""
        out: list[list[float]] = [[] for _ in range(num_agents)]
        for t in self.for_step(step):
            if t.source >= num_agents:
                raise ValueError(f"trajectory {t.prompt_id!r} has source {t.source} but num_agents={num_agents}")
            if t.reward is None:
                raise ValueError(f"trajectory {t.prompt_id!r} from agent {t.source} at step {step} is not verified")
            out[t.source].append(t.reward)
        return out

    def summary(self, step: int) -> dict[int, dict[str, float]]:
        """Per-source statistics of ``step``: count, reward mean/std, positive rate, response length, finish rate."""
        per_source: dict[int, list[Trajectory]] = defaultdict(list)
        for t in self.for_step(step):
            per_source[t.source].append(t)
        out: dict[int, dict[str, float]] = {}
        for source in sorted(per_source):
            trajs = per_source[source]
            rewards = [t.reward for t in trajs if t.reward is not None]
            stats: dict[str, float] = dict(
                num_trajectories=len(trajs),
                num_prompts=len({t.prompt_id for t in trajs}),
                num_verified=len(rewards),
                response_tokens_mean=_mean([t.source_num_tokens for t in trajs]),
                response_chars_mean=_mean([len(t.response_text) for t in trajs]),
                finished_rate=_mean([float(t.finished) for t in trajs]),
            )
            if rewards:
                mean = _mean(rewards)
                stats.update(
                    reward_mean=mean,
                    reward_std=math.sqrt(_mean([(r - mean) ** 2 for r in rewards])),
                    positive_rate=_mean([float(r > 0) for r in rewards]),
                )
            out[source] = stats
        return out

    # --------------------------------------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "keep_last_steps": self.keep_last_steps,
            "trajectories": [t.to_dict() for s in self.steps for t in self._steps[s]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"keep_last_steps", "trajectories"} - set(state)
        if missing:
            raise ValueError(f"RolloutStore.load_state_dict: missing key(s) {sorted(missing)}")
        self.__init__(state["keep_last_steps"])
        self.add(Trajectory.from_dict(d) for d in state["trajectories"])

    def dump_jsonl(self, step: int, path: str | Path) -> Path:
        """Write the trajectories of ``step`` to ``path`` as JSON lines, atomically."""
        lines = [json.dumps(t.to_dict(), ensure_ascii=False, allow_nan=False) for t in self.for_step(step)]
        return atomic_write_text(path, "".join(line + "\n" for line in lines))

    @staticmethod
    def read_jsonl(path: str | Path) -> list[Trajectory]:
        """Read trajectories written by :meth:`dump_jsonl`."""
        out = []
        for lineno, record in iter_jsonl(path):
            try:
                out.append(Trajectory.from_dict(record))
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}:{lineno}: not a trajectory record: {err}") from err
        return out


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else float("nan")
