"""benchmarks/mismatch_curves.py: per-step means over seeds of the runs' mismatch figures, the table's first / last
windows, and the plot (hand-computed values)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _module():
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("mismatch_curves", REPO / "benchmarks" / "mismatch_curves.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, rows):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return folder


def test_curves_average_each_step_over_the_seeds_that_logged_it(tmp_path):
    mc = _module()
    a = _run(tmp_path / "s0", [
        {"step": 1, "agent": "x", "mismatch/mean_abs": 1e-3, "policy/rollout_is_own_masked_frac": 0.1},
        {"step": 1, "agent": "y", "mismatch/mean_abs": 5e-3},
        {"step": 2, "agent": "x", "mismatch/mean_abs": 3e-3, "mismatch/k3_kl": float("nan")},
    ])
    b = _run(tmp_path / "s1", [
        {"step": 1, "agent": "x", "mismatch/mean_abs": 2e-3, "policy/rollout_is_own_masked_frac": 0.3},
        {"step": 1, "agent": "other", "mismatch/mean_abs": 9.0},  # not an agent of the report
    ])
    curves = mc.mismatch_over_training([a, b, tmp_path / "missing"], ["x", "y"])
    step1, step2 = curves["x"]["mismatch/mean_abs"]
    assert step1[0] == 1 and step1[1] == pytest.approx(1.5e-3) and step1[3] == 2
    assert step1[2] == pytest.approx(math.sqrt(((1e-3 - 1.5e-3) ** 2 + (2e-3 - 1.5e-3) ** 2) / 1))  # sample std
    assert step2 == [2, pytest.approx(3e-3), 0.0, 1]
    assert "mismatch/k3_kl" not in curves["x"]  # a non-finite figure is not averaged in
    assert curves["x"]["policy/rollout_is_own_masked_frac"][0][1] == pytest.approx(0.2)
    assert curves["y"]["mismatch/mean_abs"] == [[1, 5e-3, 0.0, 1]]


def test_the_table_shows_first_and_last_windows_and_the_plot_renders(tmp_path):
    mc = _module()
    rows = [{"step": s, "agent": "x", "mismatch/mean_abs": float(s)} for s in range(1, 26)]
    curves = {"arm": mc.mismatch_over_training([_run(tmp_path / "s0", rows)], ["x"])}
    lines = mc.mismatch_lines(curves, {"arm": "the arm"})
    row = next(line for line in lines if line.startswith("| the arm | x |"))
    # steps 1-10 mean 5.5, steps 16-25 mean 20.5; no correction figures logged
    assert "5.50e+00 / 2.05e+01" in row and row.endswith("| – | – | – |")
    png = mc.render_mismatch_plot(curves, {"arm": "the arm"}, "title")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert mc.mismatch_lines({}, {}) == []
