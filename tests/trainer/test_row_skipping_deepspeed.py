"""Skipping zero-gradient rows through DeepSpeed: ZeRO-0/2/3 on one rank.

The same one-step HACPO run (2 agents, 2 updates per learner, micro-batches of 4 rows) with and without
``--no_skip_zero_grad_rows --no_length_grouping`` must end with the same weights and the same non-timing metrics,
while the skipping run sent fewer rows through the backward pass. Over 2 ZeRO-3 ranks, where the ranks can hold
different numbers of rows with gradient and must stay in step, ``test_two_ranks_zero3.py`` checks the skipping
together with ``--old_logp_from_update``.
"""
from __future__ import annotations

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from fit_weights import assert_same_metrics, assert_same_weights, fit_with_weights

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

FULL = ["--no_skip_zero_grad_rows", "--no_length_grouping"]


def train(tmp_path, base_args, agents: list[str], *extra: str):
    cfg = build_config(base_args(tmp_path, *agents, "--algorithm", "hacpo", "--train_batch_size", "8",
                                 "--max_steps", "1", "--no_save_hf", *extra))
    history, weights = fit_with_weights(cfg)
    return history[-1], weights


def assert_same_result(full, skip):
    (full_records, full_weights), (skip_records, skip_weights) = full, skip
    for a, b in zip(full_weights, skip_weights):
        assert_same_weights(a, b)
    for a, b in zip(full_records, skip_records):
        assert_same_metrics(a, b)
    skipped = sum(r["perf/rows_trained"] - r["perf/rows_backward"] for r in skip_records)
    assert skipped > 0, "no row was skipped: the check would be empty"
    assert all(r["perf/rows_backward"] == r["perf/rows_trained"] for r in full_records)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_one_rank_each_zero_stage(tmp_path, tiny_agents, base_args, stage):
    agents = ["--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--agent",
              f"name=qwen,pretrain={tiny_agents['qwen']}"]
    common = ("--no_ray", "--zero_stage", str(stage))
    assert_same_result(train(tmp_path / "full", base_args, agents, *common, *FULL),
                       train(tmp_path / "skip", base_args, agents, *common))

