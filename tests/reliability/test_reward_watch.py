"""Agents whose rewards carry no signal (all 0, all 1) for several steps in a row are named in a warning."""
from __future__ import annotations

import logging

from openrlhf_hacpo.trainer.reward_watch import RewardStallWatcher


def test_constant_rewards_warn_once_per_streak(caplog):
    watcher = RewardStallWatcher(["qwen", "llama"], "labels.py", stall_steps=3)
    mixed = [1.0, 0.0, 0.0, 1.0]
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
        issued = [watcher.update(step, [[0.0] * 4, mixed]) for step in (1, 2, 3, 4)]
    assert [len(w) for w in issued] == [0, 0, 1, 0]
    assert "agent 'qwen': every reward was 0 for 3 steps in a row (up to step 3)" in issued[2][0]
    assert "labels.py" in issued[2][0] and "llama" not in caplog.text
    # a step with signal breaks the streak; a new streak (all 1 this time) warns again
    assert watcher.update(5, [mixed, mixed]) == []
    issued = [watcher.update(step, [[1.0] * 4, mixed]) for step in (6, 7, 8)]
    assert [len(w) for w in issued] == [0, 0, 1] and "every reward was 1 for 3 steps" in issued[2][0]


def test_zero_stall_steps_turns_the_warning_off():
    watcher = RewardStallWatcher(["qwen"], "exact_match", stall_steps=0)
    assert all(watcher.update(step, [[0.0] * 4]) == [] for step in range(1, 20))
