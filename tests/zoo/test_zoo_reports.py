"""zoo/reports.py from hand-written trainer records: a run's summary and table, and the statistics over seeds.

Every expectation below is computed by hand from the records written in this file."""
import json
import math

import pytest

from openrlhf_hacpo.zoo.reports import (
    agent_step_stats,
    aggregate_arm,
    build_summary,
    final_accuracy,
    fmt,
    fmt_pm,
    format_table,
    load_summary,
    mean_std,
    mismatch_stats,
    paired_differences,
    plot_validation,
    read_records,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

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


def _step(step, agent, *, own=128, rows=256, tokens=25.0, gen=0.5, logprob=0.1, update=1.0, foreign=True,
          in_window=0.5, ratio=0.8):
    rec = {"step": step, "agent": agent, "view/num_own_rows": own, "view/num_rows": rows,
           "response/tokens_mean": tokens, "time/generate": gen, "time/logprob": logprob, "time/update": update,
           "time/reward": 0.01, "time/sync": 0.0, "time/step": 2.0, "reward/mean": 0.25}
    if foreign:
        rec.update({"policy/foreign_in_window_frac": in_window, "policy/foreign_ratio_mean": ratio,
                    "policy/foreign_clip_frac_lower": 1.0 - in_window - 0.1, "policy/foreign_clip_frac_upper": 0.1})
    return rec


def test_final_accuracy_is_the_mean_of_the_last_two_evaluations_by_step():
    assert final_accuracy([(30, 0.5), (10, 0.2), (20, 0.4)]) == pytest.approx(0.45)
    assert final_accuracy([(10, 0.3)]) == pytest.approx(0.3)
    assert final_accuracy([(10, 0.2), (20, 0.4), (30, 0.9)], last=3) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        final_accuracy([])


def test_agent_step_stats_totals_and_means():
    records = [_step(1, "a", tokens=20.0, gen=0.4, update=1.0, in_window=0.6, ratio=0.9),
               _step(2, "a", tokens=30.0, gen=0.6, update=3.0, in_window=0.2, ratio=0.7)]
    stats = agent_step_stats(records, rollouts_per_step=128)
    assert stats["steps"] == 2
    assert stats["rollouts_generated"] == 256
    assert stats["rows_trained"] == 512
    assert stats["generated_tokens"] == 20 * 128 + 30 * 128                  # 6400
    assert stats["tokens_per_s"] == pytest.approx(6400 / 1.0)                # over 0.4 + 0.6 generation seconds
    assert stats["samples_trained_per_s"] == pytest.approx(512 / 4.0)       # over 1 + 3 update seconds
    assert stats["seconds"]["generate"] == pytest.approx(0.5)
    assert stats["seconds"]["update"] == pytest.approx(2.0)
    assert stats["foreign"]["in_window_frac"] == pytest.approx(0.4)
    assert stats["foreign"]["ratio_mean"] == pytest.approx(0.8)
    assert stats["foreign"]["ratio_median"] is None                          # not logged by these records

    solo = [dict(_step(1, "a", foreign=False)), dict(_step(2, "a", foreign=False))]
    for rec in solo:
        del rec["view/num_own_rows"], rec["view/num_rows"]
    stats = agent_step_stats(solo, rollouts_per_step=64)
    assert stats["foreign"] is None
    assert stats["rollouts_generated"] == 128 and stats["rows_trained"] == 128
    with pytest.raises(ValueError):
        agent_step_stats([], rollouts_per_step=1)


def _synthetic_summary():
    evals = [{"step": s, "agent": a, "accuracy": acc} for s, a, acc in
             [(10, "llama", 0.2), (10, "qwen", 0.4), (20, "llama", 0.3), (20, "qwen", 0.6),
              (30, "llama", 0.5), (30, "qwen", 0.7)]]
    steps = [_step(s, a) for s in (1, 2, 3) for a in ("llama", "qwen")]
    return build_summary(run={"preset": "model", "algorithm": "hacpo", "seed": 3, "steps": 3,
                              "n_samples_per_prompt": 8, "eval_split": "test", "eval_problems": 400},
                         acc_before={"llama": 0.1, "qwen": 0.3}, acc_after={"llama": 0.5, "qwen": 0.7},
                         step_records=steps, eval_records=evals, rollouts_per_step=128)


def test_build_summary_table_and_plot(tmp_path):
    summary = _synthetic_summary()
    llama = summary["agents"]["llama"]
    assert llama["validation"] == [[0, 0.1], [10, 0.2], [20, 0.3], [30, 0.5]]
    assert llama["acc_final"] == pytest.approx(0.4)
    assert summary["agents"]["qwen"]["acc_final"] == pytest.approx(0.65)
    assert llama["steps"] == 3 and llama["rollouts_generated"] == 384
    assert summary["run"]["rollouts_total"] == 768
    json.dumps(summary, allow_nan=False)  # serialisable as strict JSON

    table = format_table(summary)
    assert "| llama | 0.100 | 0.500 | +0.400 | 0.400 | 384 |" in table
    assert "| qwen | 0.300 | 0.700 | +0.400 | 0.650 | 384 |" in table

    path = plot_validation(summary, tmp_path / "curve.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_mean_std_and_paired_differences():
    mean, std = mean_std([0.5, 0.7, 0.6])
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1)     # sample std
    assert mean_std([0.4]) == (0.4, None)

    def arm(finals):
        return {"agents": {"a": {"final_by_seed": {str(s): v for s, v in finals.items()}}}}

    d = paired_differences(arm({0: 0.6, 1: 0.5, 2: 0.9}), arm({0: 0.4, 1: 0.55, 3: 0.1}))["a"]
    assert d["seeds"] == [0, 1]
    assert d["diffs"] == pytest.approx([0.2, -0.05])
    assert d["mean"] == pytest.approx(0.075) and d["positive"] == 1
    assert d["std"] == pytest.approx(math.sqrt(((0.2 - 0.075) ** 2 + (-0.05 - 0.075) ** 2) / 1))


def test_mismatch_figures_over_the_run_and_in_the_table():
    """Means over the steps that logged a figure, the largest |Δ| over them, each partner's rows apart; a run
    without the figures has none (and no line under the table)."""
    records = [{"mismatch/mean_abs": 1e-7, "mismatch/max_abs": 2e-5, "mismatch/k3_kl": 1e-13,
                "mismatch/seq_log_ratio_mean": -2e-8, "mismatch/seq_log_ratio_std": 1e-7, "mismatch/ppl_ratio": 1.0,
                "mismatch/source/b/mean_abs": 4e-3, "mismatch/source/b/max_abs": 0.5},
               {"mismatch/mean_abs": 3e-7, "mismatch/max_abs": 5e-6, "mismatch/k3_kl": 3e-13,
                "mismatch/seq_log_ratio_mean": 4e-8, "mismatch/seq_log_ratio_std": 3e-7, "mismatch/ppl_ratio": 1.5,
                "mismatch/source/b/mean_abs": 2e-3, "mismatch/source/b/max_abs": 0.25},
               {}]  # a step without them (e.g. none of the agent's rows scored)
    stats = mismatch_stats(records)
    own = stats["own"]
    assert own["mean_abs"] == pytest.approx(2e-7) and own["max_abs"] == pytest.approx(2e-5)
    assert own["k3_kl"] == pytest.approx(2e-13) and own["seq_log_ratio_mean"] == pytest.approx(1e-8)
    assert own["seq_log_ratio_std"] == pytest.approx(2e-7) and own["ppl_ratio"] == pytest.approx(1.25)
    assert list(stats["sources"]) == ["b"]
    assert stats["sources"]["b"]["mean_abs"] == pytest.approx(3e-3) and stats["sources"]["b"]["max_abs"] == 0.5
    assert stats["sources"]["b"]["k3_kl"] is None  # not logged
    assert mismatch_stats([{}, {"reward/mean": 0.5}]) is None

    summary = _synthetic_summary()
    assert summary["agents"]["llama"]["mismatch"] is None and "mismatch/*" not in format_table(summary)
    summary["agents"]["llama"]["mismatch"] = stats
    assert "- llama: mean |Δ| 2.0e-07 per token (largest 2.0e-05), k3 KL 2.0e-13" in format_table(summary)
