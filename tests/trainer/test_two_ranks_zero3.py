"""Both exact savings of the train phase over 2 ZeRO-3 data-parallel ranks, in one comparison.

The same one-step HACPO run (llama on 2 ZeRO-3 ranks, qwen on one; 2 updates per learner, micro-batches of 2 rows)
is made twice: once as the plain computation (every row through the backward pass, no length grouping, the scoring
pass for the old log-probs), once with both savings on (zero-gradient rows skipped, micro-batches grouped by length,
``--old_logp_from_update``'s two-phase step). Both must end with the same weights and the same non-timing metrics.

With 2 ranks, the ranks can hold different numbers of rows with gradient, and the two-phase step runs each rank's
forwards in two calls; a rank that falls out of step hangs or fails ZeRO-3's gathers. One rank per configuration
(and each saving alone, so that a failure names the saving at fault) is checked in
``test_row_skipping_deepspeed.py`` and ``test_old_logp_from_update.py``.
"""
from __future__ import annotations

import json

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from fit_weights import assert_same_metrics, assert_same_weights, fit_with_weights

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

PLAIN = ("--no_skip_zero_grad_rows", "--no_length_grouping")
SAVING = ("--old_logp_from_update",)


def train(tmp_path, base_args, tiny_agents, *extra: str):
    agents = ["--agent", f"name=llama,pretrain={tiny_agents['llama']},dp_size=2,zero_stage=3",
              "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}"]
    cfg = build_config(base_args(tmp_path, *agents, "--algorithm", "hacpo", "--train_batch_size", "8",
                                 "--max_steps", "1", "--micro_train_batch_size", "2", "--no_save_hf",
                                 "--save_rollouts", *extra))
    (records,), weights = fit_with_weights(cfg)
    return records, weights


def test_skipping_and_old_logp_from_update_change_nothing_but_the_work(ray_cluster, tmp_path, tiny_agents,
                                                                        base_args):
    plain_records, plain_weights = train(tmp_path / "plain", base_args, tiny_agents, *PLAIN)
    saving_records, saving_weights = train(tmp_path / "saving", base_args, tiny_agents, *SAVING)

    for a, b in zip(plain_weights, saving_weights, strict=True):
        assert_same_weights(a, b)
    for a, b in zip(plain_records, saving_records, strict=True):
        assert a["agent"] == b["agent"] and a["updates"] == b["updates"] == 2
        assert_same_metrics(a, b)
        assert a["perf/rows_backward"] == a["perf/rows_trained"]  # the plain run skipped nothing
        assert "perf/pad_frac_scoring" in a and "perf/pad_frac_scoring" not in b  # only the plain run scored

    skipped = sum(r["perf/rows_trained"] - r["perf/rows_backward"] for r in saving_records)
    assert skipped > 0, "no row was skipped: the check would be empty"
    dumped = [json.loads(line) for line in
              (tmp_path / "saving" / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(dumped) == 2 * 2 * 4 and all(isinstance(t["source_logp_sum"], float) for t in dumped)
