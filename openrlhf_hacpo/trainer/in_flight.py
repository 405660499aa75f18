"""A step's generated batch, between its generation and its training: what ``--one_step_off`` keeps in flight.

With ``--one_step_off`` the engines generate step t+1's rollouts (weights W_{t-1}) while the learners train on
step t, so at the end of step t batch t+1 exists already: sampled, scored and verified. No checkpoint keeps W_{t-1},
so the batch cannot be regenerated after a resume; it is saved with the checkpoint of step t instead
(:meth:`GeneratedBatch.state_dict`, in the trainer state) and trained on from there (:meth:`GeneratedBatch.from_state`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openrlhf_hacpo.actors.results import RolloutResult
from openrlhf_hacpo.rollout import Trajectory

__all__ = ["GeneratedBatch"]


@dataclass
class GeneratedBatch:
    """Batch ``step``: every agent's :class:`RolloutResult` (agent order; trajectories verified) and the driver's
    seconds spent on it (``rollout_phase``: waiting for the rollouts, ``reward``: verifying them)."""

    step: int
    rollouts: list[RolloutResult]
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        """Every agent's trajectories, agent after agent."""
        return [t for r in self.rollouts for t in r.trajectories]

    def state_dict(self) -> dict[str, Any]:
        """Plain containers only (``torch.load(weights_only=True)`` reads them back); log-probs as lists of floats,
        each exactly its float32 value (:meth:`Trajectory.to_dict`)."""
        return {
            "step": self.step,
            "phases": dict(self.phases),
            "rollouts": [{"trajectories": [t.to_dict() for t in r.trajectories], "timings": dict(r.timings),
                          "generated_tokens": r.generated_tokens, "scoring_positions": r.scoring_positions,
                          "scoring_tokens": r.scoring_tokens,
                          "mismatch_rows": [list(row) for row in r.mismatch_rows]} for r in self.rollouts],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], num_agents: int, where: str) -> "GeneratedBatch":
        """The batch :meth:`state_dict` saved; ``where`` names the checkpoint in errors."""
        rollouts = state.get("rollouts")
        if not isinstance(rollouts, list) or len(rollouts) != num_agents:
            raise ValueError(f"{where}: the batch in flight holds {len(rollouts) if isinstance(rollouts, list) else 0} "
                             f"agents' rollouts, this run has {num_agents} agents")
        results = [RolloutResult(trajectories=tuple(Trajectory.from_dict(t) for t in r["trajectories"]),
                                 timings=dict(r["timings"]), generated_tokens=int(r["generated_tokens"]),
                                 scoring_positions=int(r["scoring_positions"]), scoring_tokens=int(r["scoring_tokens"]),
                                 mismatch_rows=_rows(r.get("mismatch_rows", ())))
                   for r in rollouts]
        return cls(step=int(state["step"]), rollouts=results, phases=dict(state.get("phases", {})))


def _rows(rows: Any) -> tuple[tuple[float, ...], ...]:
    """The saved ``RolloutResult.mismatch_rows`` (none in a checkpoint written before the mismatch/* metrics)."""
    return tuple(tuple(float(x) for x in row) for row in rows)
