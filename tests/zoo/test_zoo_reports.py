"""zoo/reports.py from hand-written trainer records: a run's summary and table, and the statistics over seeds.

Every expectation below is computed by hand from the records written in this file."""
import json
import math

import pytest

from openrlhf_hacpo.zoo.reports import (
    aggregate_arm,
    build_summary,
    fmt,
    fmt_pm,
    format_table,
    load_summary,
    read_records,
)

METRICS = """\
{"step": 1, "agent": "a", "view/num_own_rows": 4, "view/num_rows": 8, "response/tokens_mean": 10, "time/generate": 2, "time/update": 4, "time/step": 8, "time/logprob": null, "reward/mean": 0.5, "policy/foreign_in_window_frac": 0.25, "policy/foreign_ratio_mean": 0.9}
{"step": 1, "agent": "b", "response/tokens_mean": 5, "time/generate": 1, "time/update": 0.5, "time/step": 3, "reward/mean": 0.0}

{"step": 2, "agent": "a", "view/num_own_rows": 4, "view/num_rows": 8, "response/tokens_mean": 20, "time/generate": 3, "time/update": 4, "time/step": 10, "time/logprob": 0.5, "reward/mean": 1.0, "policy/foreign_in_window_frac": 0.75, "policy/foreign_ratio_mean": 1.1}
{"step": 2, "agent": "b", "response/tokens_mean": 5, "time/generate": 1, "time/update": 0.5, "time/step": 5, "reward/mean": 0.5}
{"step": 3, "agent": "a", "view/num_own_r"""
EVALS = """\
{"step": 0, "agent": "a", "accuracy": 0.1}
{"step": 1, "agent": "a", "accuracy": 0.5}
{"step": 2, "agent": "a", "accuracy": 0.7}
{"step": 2, "agent": "b", "accuracy": 0.4}
"""


def _summary(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(METRICS)
    (tmp_path / "eval.jsonl").write_text(EVALS)
    steps = read_records(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["agent"]) for r in steps] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]  # torn step 3 gone
    return build_summary(run={"preset": "p", "algorithm": "hacpo", "seed": 0, "steps": 2, "n_samples_per_prompt": 2},
                         acc_before={"a": 0.2, "b": 0.3}, acc_after={"a": 0.7, "b": 0.45}, step_records=steps,
                         eval_records=read_records(tmp_path / "eval.jsonl"), rollouts_per_step=4)


def test_summary_from_hand_written_records(tmp_path):
    summary = _summary(tmp_path)
    a, b = summary["agents"]["a"], summary["agents"]["b"]
    # a learns from foreign rows: 4 own + 4 foreign per step; tokens 10·4 + 20·4 = 120 over 2 + 3 generation seconds
    assert (a["steps"], a["rollouts_generated"], a["rows_trained"], a["generated_tokens"]) == (2, 8, 16, 120)
    assert a["tokens_per_s"] == pytest.approx(24.0)
    assert a["samples_trained_per_s"] == pytest.approx(16 / 8)
    assert a["seconds"]["step"] == pytest.approx(9.0) and a["seconds"]["generate"] == pytest.approx(2.5)
    assert a["seconds"]["logprob"] == pytest.approx(0.5)              # the null of step 1 is not a zero
    assert a["seconds"]["reward"] is None                             # never logged
    assert a["foreign"]["in_window_frac"] == pytest.approx(0.5) and a["foreign"]["ratio_mean"] == pytest.approx(1.0)
    assert a["train_reward_last10"] == pytest.approx(0.75)
    # the step-0 evaluation is replaced by acc_before; final = mean of the last two evaluations
    assert a["validation"] == [[0, 0.2], [1, 0.5], [2, 0.7]]
    assert a["acc_final"] == pytest.approx(0.6)
    # b trains alone: rollouts_per_step own rows per step, tokens 5·4·2 = 40 over 2 generation seconds
    assert (b["rollouts_generated"], b["rows_trained"], b["generated_tokens"]) == (8, 8, 40)
    assert b["tokens_per_s"] == pytest.approx(20.0) and b["foreign"] is None
    assert b["acc_final"] == pytest.approx(0.4) and b["validation"] == [[0, 0.3], [2, 0.4]]
    assert summary["run"]["rollouts_total"] == 16

    table = format_table(summary).splitlines()
    assert table[0] == "preset p · hacpo · seed 0 · 2 steps · G=2"
    assert table[4:] == ["| a | 0.200 | 0.700 | +0.500 | 0.600 | 8 |", "| b | 0.300 | 0.450 | +0.150 | 0.400 | 8 |"]


def test_load_summary(tmp_path):
    assert load_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text(json.dumps({"run": {}, "agents": {}}))
    assert load_summary(tmp_path) == {"run": {}, "agents": {}}


def test_aggregate_over_seeds(tmp_path):
    one = _summary(tmp_path)
    other = json.loads(json.dumps(one))
    other["agents"]["a"].update(acc_final=0.8, validation=[[0, 0.2], [1, 0.7], [2, 0.9]])
    other["agents"]["a"]["seconds"]["step"] = 11.0
    one["run"].update(wall_seconds=100.0, train_seconds=80.0)
    other["run"].update(wall_seconds=120.0, train_seconds=90.0)
    arm = aggregate_arm({3: other, 1: one})
    assert arm["seeds"] == [1, 3]
    assert arm["wall_seconds"] == pytest.approx(110.0) and arm["train_seconds"] == pytest.approx(85.0)
    a = arm["agents"]["a"]
    assert a["final_by_seed"] == {"1": pytest.approx(0.6), "3": pytest.approx(0.8)}
    assert a["final_mean"] == pytest.approx(0.7)
    assert a["final_std"] == pytest.approx(math.sqrt((0.1 ** 2 + 0.1 ** 2) / 1))   # sample std, n - 1 = 1
    assert a["curve"] == [[0, pytest.approx(0.2), pytest.approx(0.0)], [1, pytest.approx(0.6), pytest.approx(0.1414213)],
                          [2, pytest.approx(0.8), pytest.approx(0.1414213)]]
    assert a["seconds"]["step"] == pytest.approx(10.0)
    assert a["rollouts_per_step"] == pytest.approx(4.0)
    assert a["foreign"]["in_window_frac"] == pytest.approx(0.5)
    assert arm["agents"]["b"]["foreign"] is None and arm["agents"]["b"]["final_std"] == pytest.approx(0.0)


def test_number_formats():
    assert fmt(None) == "–" and fmt(0.12345) == "0.123" and fmt(0.1, digits=1, signed=True) == "+0.1"
    assert fmt_pm(0.5, None) == "0.500" and fmt_pm(-0.05, 0.0123, signed=True) == "-0.050 ± 0.012"
    assert fmt_pm(None, 0.1) == "–"
