"""benchmarks/mismatch_table.py: per-agent figures from hand-made metrics records, refusals read from a run's log,
and the table."""
from __future__ import annotations

import pytest
from benchmark_script import load_benchmark


def _rec(step, agent, mean_abs, max_abs):
    return {"step": step, "agent": agent, "mismatch/mean_abs": mean_abs, "mismatch/max_abs": max_abs,
            "mismatch/k3_kl": mean_abs ** 2 / 2, "mismatch/ppl_ratio": 1.0 + mean_abs}


def test_figures_are_means_over_steps_and_the_largest_max():
    table = load_benchmark("mismatch_table")
    figures = table.cell_figures([_rec(1, "a", 1e-3, 0.1), _rec(2, "a", 3e-3, 0.3), _rec(1, "b", 2e-7, 1e-5),
                                  {"step": 2, "agent": "b"}])  # a step of b without figures (e.g. a skipped one)
    assert figures["a"]["mean_abs"] == pytest.approx(2e-3) and figures["a"]["max_abs"] == pytest.approx(0.2)
    assert figures["a"]["max_abs_max"] == pytest.approx(0.3) and figures["a"]["steps"] == 2
    assert figures["a"]["k3_kl"] == pytest.approx((0.5e-6 + 4.5e-6) / 2)
    assert figures["b"]["mean_abs"] == pytest.approx(2e-7) and figures["b"]["steps"] == 2
    assert "seq_log_ratio_std" not in figures["a"]  # not logged: left out, never 0


def test_refusals_are_read_from_the_log_and_tabled():
    table = load_benchmark("mismatch_table")
    log = "starting\nTraceback ...\nValueError: agent 'x': head size 16 is not supported\n"
    assert table.refusal(log) == "agent 'x': head size 16 is not supported"
    assert table.refusal("crashed without a message\n") is None
    payload = {"preset": "model", "command": "python benchmarks/mismatch_table.py", "date": "2026-12-05",
               "machine": "x86_64, 2 CPUs", "steps": 2, "seed": 0,
               "cells": [{"backend": "hf_engine", "dtype": "bfloat16", "agents": table.cell_figures(
                   [_rec(1, "a", 1e-3, 0.1), _rec(2, "a", 3e-3, 0.3)])},
                         {"backend": "vllm", "dtype": "float32", "refused": "head size 16 is not supported"}]}
    md = table.format_table(payload)
    assert "| hf_engine | bfloat16 | a | 2.00e-03 | 2.00e-01 | 3.00e-01 |" in md
    assert "| vllm | float32 | – | head size 16 is not supported |" in md
