"""Agent capability estimate P̂ (eq. 9) and the clipped capability ratios ω (eqs. 8, 10).

Per step τ each agent k gets a capability P_τ^(k) from its own rewards in the step batch, and

    P̂_t^(k) = max( (1/K) Σ_{τ=t−K+1..t} P_τ^(k), floor )                      (eq. 9, code floor)

over the last K steps, the current one included (fewer while the history is shorter). Ratios are

    R[a, b] = clip( P̂^(a) / P̂^(b), ratio_min, ratio_max )                      (eq. 8, code clip)

so learner k's baseline weights are ω^(k,j) = R[k, j] (eq. 7) and its foreign-row coefficients are
ω^(j,k) = R[j, k] (eq. 10). During warm-up, and before the first update, every ratio is 1.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .config import CapabilityConfig

__all__ = ["CapabilityRatios", "CapabilityStep", "CapabilityTracker", "step_capability", "capability_ratios"]


def step_capability(rewards: torch.Tensor, metric: str = "positive_rate", *, name: str = "rewards") -> float:
    """P_τ of one agent from its rewards in one step: fraction > 0 (``positive_rate``) or the mean (eq. 9)."""
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.numel() == 0:
        raise ValueError(f"{name} is empty: an agent needs at least one reward per step")
    values = rewards.detach().reshape(-1).to(torch.float64)
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} contains NaN or inf")
    if metric == "positive_rate":
        return float((values > 0).to(torch.float64).mean())
    if metric == "mean_reward":
        return float(values.mean())
    raise ValueError(f"unknown capability metric {metric!r}; expected one of ['positive_rate', 'mean_reward']")


def capability_ratios(capabilities: torch.Tensor, ratio_min: float = 0.1, ratio_max: float = 10.0) -> torch.Tensor:
    """R[a, b] = clip(P̂_a / P̂_b, ratio_min, ratio_max) for a vector of positive capabilities (eqs. 8, 10)."""
    caps = torch.as_tensor(capabilities, dtype=torch.float64)
    if caps.dim() != 1 or caps.numel() == 0:
        raise ValueError(f"capabilities must be a non-empty 1-D tensor, got shape {tuple(caps.shape)}")
    if not bool(torch.isfinite(caps).all()) or bool((caps <= 0).any()):
        raise ValueError(f"capabilities must be finite and > 0, got {caps.tolist()}")
    return (caps[:, None] / caps[None, :]).clamp(ratio_min, ratio_max)


@dataclass(frozen=True)
class CapabilityRatios:
    """The clipped capability ratios R[a, b] = clip(P̂_a / P̂_b) of one step (float64 [n, n]), read in the two
    directions the algorithm uses them; learners receive this value, not the tracker."""

    matrix: torch.Tensor

    def __post_init__(self) -> None:
        m = self.matrix
        if not isinstance(m, torch.Tensor) or m.dim() != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"CapabilityRatios.matrix must be a square [n, n] tensor, got "
                             f"{list(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__}")
        object.__setattr__(self, "matrix", m.detach().to(torch.float64).cpu())

    @property
    def num_agents(self) -> int:
        return int(self.matrix.shape[0])

    def baseline_weights(self, learner: int) -> torch.Tensor:
        """ω^(k,j) = R[k, j] for every source j: learner k's weights in the advantage baseline (eqs. 7–8), [n]."""
        return self.matrix[self._agent(learner)].clone()

    def coefficients(self, learner: int) -> torch.Tensor:
        """ω^(j,k) = R[j, k] for every source j: the coefficient of learner k's foreign rows (eq. 10), [n]."""
        return self.matrix[:, self._agent(learner)].clone()

    def _agent(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_agents:
            raise ValueError(f"learner must be an agent index in [0, {self.num_agents}), got {index!r}")
        return index


@dataclass(frozen=True)
class CapabilityStep:
    """What one :meth:`CapabilityTracker.update` measured: ``step`` = P_τ of every agent from this step's rewards
    alone, ``smoothed`` = P̂ over the window (eq. 9), both float64 [n]."""

    step: torch.Tensor
    smoothed: torch.Tensor


class CapabilityTracker:
    """Sliding-window capability P̂ of ``num_agents`` agents and their clipped ratios."""

    def __init__(self, num_agents: int, cfg: CapabilityConfig | None = None) -> None:
        if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
            raise ValueError(f"num_agents must be an int >= 1, got {num_agents!r}")
        self.num_agents = num_agents
        self.cfg = cfg if cfg is not None else CapabilityConfig()
        self._history: list[deque[float]] = [deque(maxlen=self.cfg.window) for _ in range(num_agents)]
        self.num_updates = 0

    # -- updating -------------------------------------------------------------------------------------------
    def update(self, per_agent_rewards: Sequence[torch.Tensor]) -> CapabilityStep:
        """Record this step's P_τ of every agent (one reward tensor per agent, in agent order); returns P_τ and
        the new P̂."""
        if isinstance(per_agent_rewards, torch.Tensor) or not isinstance(per_agent_rewards, Sequence):
            raise TypeError("per_agent_rewards must be a list with one reward tensor per agent")
        if len(per_agent_rewards) != self.num_agents:
            raise ValueError(
                f"per_agent_rewards has {len(per_agent_rewards)} entries, expected one per agent ({self.num_agents})"
            )
        values = [
            step_capability(rewards, self.cfg.metric, name=f"per_agent_rewards[{agent}]")
            for agent, rewards in enumerate(per_agent_rewards)
        ]
        for agent, value in enumerate(values):
            self._history[agent].append(value)
        self.num_updates += 1
        return CapabilityStep(step=torch.tensor(values, dtype=torch.float64), smoothed=self.capabilities())

    # -- reading --------------------------------------------------------------------------------------------
    def capabilities(self) -> torch.Tensor:
        """P̂ of every agent, float64 [num_agents]; the floor before the first update."""
        out = [max(sum(h) / len(h), self.cfg.floor) if h else self.cfg.floor for h in self._history]
        return torch.tensor(out, dtype=torch.float64)

    @property
    def in_warmup(self) -> bool:
        """True before the first update and during the first ``warmup_steps`` updates (all ratios are 1)."""
        return self.num_updates == 0 or self.num_updates <= self.cfg.warmup_steps

    def ratio_matrix(self) -> torch.Tensor:
        """R[a, b] = clip(P̂_a / P̂_b, ratio_min, ratio_max), float64 [n, n]; all ones during warm-up."""
        if self.in_warmup:
            return torch.ones(self.num_agents, self.num_agents, dtype=torch.float64)
        return capability_ratios(self.capabilities(), self.cfg.ratio_min, self.cfg.ratio_max)

    def ratios(self) -> CapabilityRatios:
        """The ratio matrix as the typed value learners receive."""
        return CapabilityRatios(self.ratio_matrix())

    def ratio(self, a: int, b: int) -> float:
        """R[a, b] = clip(P̂_a / P̂_b) as a float."""
        self._check_agent("a", a)
        self._check_agent("b", b)
        return float(self.ratio_matrix()[a, b])

    def _check_agent(self, name: str, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_agents:
            raise ValueError(f"{name} must be an agent index in [0, {self.num_agents}), got {index!r}")

    # -- persistence ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain python state (json- and torch-serialisable)."""
        return {
            "num_agents": self.num_agents,
            "num_updates": self.num_updates,
            "history": [list(h) for h in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; only the last ``window`` values of each history are kept."""
        for key in ("num_agents", "num_updates", "history"):
            if key not in state:
                raise ValueError(f"capability tracker state is missing {key!r}")
        if state["num_agents"] != self.num_agents:
            raise ValueError(
                f"capability tracker state is for {state['num_agents']} agents, this tracker has {self.num_agents}"
            )
        history = state["history"]
        if len(history) != self.num_agents:
            raise ValueError(f"capability tracker state has {len(history)} histories, expected {self.num_agents}")
        restored = []
        for agent, values in enumerate(history):
            values = [float(v) for v in values]
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"capability tracker state history[{agent}] contains NaN or inf")
            restored.append(deque(values, maxlen=self.cfg.window))
        num_updates = state["num_updates"]
        if isinstance(num_updates, bool) or not isinstance(num_updates, int) or num_updates < 0:
            raise ValueError(f"capability tracker state num_updates must be an int >= 0, got {num_updates!r}")
        self._history = restored
        self.num_updates = num_updates
