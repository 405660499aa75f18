"""benchmarks/two_node_compare.py's table: per (step, agent) the count of non-timing numbers and their largest
absolute and relative difference, timing left out, and a verdict that fails on a difference beyond the tolerance or a
missing record (hand-made records)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from two_node_compare import comparison_lines, step_seconds  # noqa: E402


def _run(loss_b: float, extra_step: bool = False) -> dict:
    records = {(1, "a"): {"step": 1, "agent": "a", "loss": 0.5, "reward/mean": 0.25, "time/step": 2.0},
               (1, "b"): {"step": 1, "agent": "b", "loss": loss_b, "reward/mean": 0.75, "time/step": 4.0}}
    if extra_step:
        records[(2, "a")] = {"step": 2, "agent": "a", "loss": 0.5, "time/step": 3.0}
    return records


def test_equal_runs_pass_and_the_table_counts_numbers_without_timing():
    lines, ok = comparison_lines(_run(-0.125), _run(-0.125))
    assert ok
    # step and the two values: "agent" is text, time/step is timing
    assert lines[2:] == ["| 1 | a | 3 | 0 | 0 |", "| 1 | b | 3 | 0 | 0 |"]
    assert step_seconds(_run(0.0)) == 3.0


def test_a_difference_beyond_the_tolerance_or_a_missing_record_fails():
    lines, ok = comparison_lines(_run(-0.125), _run(-0.1250001))  # 1e-7 apart: within atol 1e-6
    assert ok and lines[3] == "| 1 | b | 3 | 1e-07 | 8e-07 |"
    _, ok = comparison_lines(_run(-0.125), _run(-0.126))
    assert not ok
    _, ok = comparison_lines(_run(-0.125, extra_step=True), _run(-0.125))
    assert not ok
