"""Warning for agents that learn nothing because their rewards carry no signal.

When every reward an agent received in a step is the same value (all 0 for labels that never match, all 1 for a
task that is too easy), its responses carry no signal: with ``gspo`` / ``grpo`` every advantage of the agent is 0,
with ``hacpo`` its own rows only move relative to the other agents. After ``stall_steps`` such steps in a row the
watcher logs a warning naming the agent, the value and the reward function; it warns again only after the streak
has been broken.
"""
from __future__ import annotations

import logging
from typing import Sequence

__all__ = ["RewardStallWatcher"]

logger = logging.getLogger(__name__)


class RewardStallWatcher:
    """Counts consecutive constant-reward steps per agent.

    Args:
        agents: agent names, in source order.
        reward_fn: the reward function's name or path (for the message).
        stall_steps: streak length that triggers the warning; 0 turns the watcher off.
    """

    def __init__(self, agents: Sequence[str], reward_fn: str, stall_steps: int) -> None:
        self.agents = list(agents)
        self.reward_fn = reward_fn
        self.stall_steps = stall_steps
        self.streaks = [0] * len(self.agents)

    def update(self, step: int, rewards_by_agent: Sequence[Sequence[float]]) -> list[str]:
        """Record one step's rewards (one list per agent); returns the warnings issued at this step."""
        warnings = []
        if self.stall_steps <= 0:
            return warnings
        for k, rewards in enumerate(rewards_by_agent):
            constant = len(rewards) > 0 and min(rewards) == max(rewards)
            self.streaks[k] = self.streaks[k] + 1 if constant else 0
            if self.streaks[k] == self.stall_steps:
                message = (f"agent {self.agents[k]!r}: every reward was {rewards[0]:g} for {self.stall_steps} steps in "
                           f"a row (up to step {step}); its own responses carry no learning signal. Check the "
                           f"reward function {self.reward_fn} and the labels (--label_key)")
                logger.warning(message)
                warnings.append(message)
        return warnings
