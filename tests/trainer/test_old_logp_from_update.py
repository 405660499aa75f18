"""Old log-probs from the first update's forward through the whole trainer: the two-phase step of
``--old_logp_from_update`` (own rows first, their old log-probs to every learner, then the rest) against the
scoring pass.

The same HACPO (and GSPO) run (2 agents, 2 updates per learner and step, so phase 1 also scores the own rows of the
second update; 2 steps on one rank) with and without the flag must end with the same weights and the same
non-timing metrics, and the saving run's rollout dump must hold every trajectory's old log-prob sum. Over 2 ZeRO-3
ranks, whose forwards must stay in step in both phases, ``test_two_ranks_zero3.py`` checks it together with the
zero-gradient row skipping.
"""
from __future__ import annotations

import json

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from fit_weights import assert_same_metrics, assert_same_weights, fit_with_weights

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def train(tmp_path, base_args, agents: list[str], steps: int, *extra: str, algorithm: str = "hacpo"):
    rows = 8 if algorithm == "hacpo" else 4  # a learner's rows per step: 16 with foreign rows, 8 without
    cfg = build_config(base_args(tmp_path, *agents, "--algorithm", algorithm, "--train_batch_size", str(rows),
                                 "--max_steps", str(steps), "--no_save_hf", "--save_rollouts", *extra))
    history, weights = fit_with_weights(cfg)
    return [r for step in history for r in step], weights


def assert_same_run(scored, saving, saving_path, steps: int):
    (scored_records, scored_weights), (saving_records, saving_weights) = scored, saving
    for a, b in zip(scored_weights, saving_weights):
        assert_same_weights(a, b)
    for a, b in zip(scored_records, saving_records):
        assert a["updates"] == b["updates"] == 2
        assert_same_metrics(a, b)
        assert "perf/pad_frac_scoring" not in b  # no scoring pass ran
    dumped = [json.loads(line) for line in (saving_path / "rollouts" / f"step_{steps:06d}.jsonl").read_text().splitlines()]
    assert dumped and all(isinstance(t["source_logp_sum"], float) for t in dumped)


@pytest.mark.parametrize("algorithm", ["hacpo", "gspo"])
def test_one_rank_each(tmp_path, tiny_agents, base_args, algorithm):
    """HACPO runs the two phases with the exchange between them; GSPO one call per learner, whose result brings
    the old log-prob sums the rollout dump holds."""
    agents = ["--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--agent",
              f"name=qwen,pretrain={tiny_agents['qwen']}"]
    assert_same_run(train(tmp_path / "scored", base_args, agents, 2, "--no_ray", algorithm=algorithm),
                    train(tmp_path / "saving", base_args, agents, 2, "--no_ray", "--old_logp_from_update",
                          algorithm=algorithm),
                    tmp_path / "saving", 2)

