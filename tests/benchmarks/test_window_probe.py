"""benchmarks/window_probe.py: quantiles and window fractions by hand, and the per-step fractions read back from a
run's metrics.jsonl and averaged over runs."""
import json
import math

import pytest
from benchmark_script import load_benchmark


def test_quantiles_and_window_fractions_by_hand():
    probe = load_benchmark("window_probe")
    values = [0.5, 0.9, 1.0, 1.2, 0.7]
    assert probe.quantile(values, 0.5) == 0.9
    assert probe.quantile(values, 0.25) == 0.7 and probe.quantile(values, 0.1) == pytest.approx(0.5 + 0.4 * 0.2)
    q = probe.ratio_quantiles(values)
    assert (q["below"], q["in_window"], q["above"]) == (pytest.approx(0.4), pytest.approx(0.4), pytest.approx(0.2))
    assert q["median"] == 0.9 and probe.ratio_quantiles([])["median"] is None


def test_window_over_training_averages_runs_per_step(tmp_path):
    probe = load_benchmark("window_probe")

    def record(step, agent, pos_in, neg_below):
        return {"step": step, "agent": agent, "policy/foreign_pos_in_window_frac": pos_in,
                "policy/foreign_pos_clip_frac_lower": 1 - pos_in, "policy/foreign_pos_clip_frac_upper": 0.0,
                "policy/foreign_neg_clip_frac_lower": neg_below, "policy/foreign_neg_in_window_frac": 1 - neg_below,
                "policy/foreign_neg_clip_frac_upper": 0.0}

    runs = []
    for i, (a, b) in enumerate(((0.2, 0.6), (0.4, 0.8))):
        run = tmp_path / f"seed{i}"
        run.mkdir()
        lines = [record(1, "x", a, b), record(2, "x", a + 0.1, b)]
        if i == 0:
            lines.append({"step": 3, "agent": "x"})  # a step without foreign rows: left out of the means
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
        runs.append(run)
    curves = probe.window_over_training(runs, ["x"])["x"]
    # columns: step, pos below / in / above, neg below / in / above
    assert curves[0] == pytest.approx([1, 0.7, 0.3, 0.0, 0.7, 0.3, 0.0])
    assert curves[1][2] == pytest.approx(0.4) and curves[1][4] == pytest.approx(0.7)
    assert curves[2][0] == 3 and all(math.isnan(v) for v in curves[2][1:])
