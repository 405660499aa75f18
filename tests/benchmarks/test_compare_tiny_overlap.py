"""benchmarks/compare_tiny_overlap.py: the first step a mean curve reaches a target, where a mean lies against a seed
spread, and the report's rows, on hand-made arms."""
from __future__ import annotations

from benchmark_script import load_benchmark


def _module():
    return load_benchmark("compare_tiny_overlap")


def _arm(finals: dict, curve: dict, before: float = 0.1) -> dict:
    agents = {}
    for name, values in finals.items():
        mean = sum(values.values()) / len(values)
        std = (sum((v - mean) ** 2 for v in values.values()) / (len(values) - 1)) ** 0.5
        agents[name] = {"final_by_seed": {str(s): v for s, v in values.items()}, "final_mean": mean,
                        "final_std": std, "acc_before": before, "curve": curve[name]}
    return {"seeds": sorted({s for values in finals.values() for s in values}), "agents": agents}


def test_first_step_at_a_target():
    bench = _module()
    curve = [[0, 0.1, 0.0], [10, 0.29, 0.01], [20, 0.3, 0.02], [30, 0.25, 0.01]]
    assert bench.first_step_at(curve, 0.3) == 20  # at or above, the first one
    assert bench.first_step_at(curve, 0.29) == 10
    assert bench.first_step_at(curve, 0.31) is None


def test_inside_the_spread():
    bench = _module()
    assert bench.inside_spread(0.5, 0.45, 0.05) == "inside"
    assert bench.inside_spread(0.51, 0.45, 0.05) == "above"
    assert bench.inside_spread(0.39, 0.45, 0.05) == "below"


def test_summary_and_report_rows():
    bench = _module()
    sync = _arm({"a": {0: 0.2, 1: 0.4}}, {"a": [[0, 0.1, 0.0], [10, 0.2, 0.0], [20, 0.3, 0.1]]})
    overlap = _arm({"a": {0: 0.5, 1: 0.6}}, {"a": [[0, 0.1, 0.0], [10, 0.35, 0.0], [20, 0.55, 0.05]]})
    summary = bench.summarize(sync, overlap, {"a": 0.3})
    # sync: mean 0.3 ± 0.1414; overlap mean 0.55 lies above 0.3 + 0.1414
    assert summary["a"]["overlap_vs_spread"] == "above"
    assert (summary["a"]["sync_step"], summary["a"]["overlap_step"]) == (20, 10)
    meta = {"agents": ["a"], "commands": ["python benchmarks/compare_tiny_overlap.py"], "date": "2026-12-02",
            "cpu_count": 2, "lanes": 2, "steps": 20, "fingerprints": {"a": "aaa"}}
    text = bench.render("hacpo-overlap", sync, overlap, summary, meta)
    assert "| 0 | 0.200 / 0.500 |" in text and "| 1 | 0.400 / 0.600 |" in text
    assert "+0.250 ± 0.071 (2/2 seeds > 0)" in text  # paired differences 0.3 and 0.2
    assert "| first step the synchronous mean reaches it | 20 |" in text
    assert "| first step the one-step-off mean reaches it | 10 |" in text
    assert "| 10 | 0.200 / 0.350 |" in text
