"""A run beside the README's numbers (openrlhf_hacpo/zoo/reference.py): Student's t quantiles against closed forms
and a float64 integral of the density, the prediction interval by hand, every status of the comparison, the table
the main job prints, and that the arm settings benchmarks/compare_tiny.py writes are the ones a main job records."""
import json
import math
import statistics

import pytest
from benchmark_script import load_benchmark

from openrlhf_hacpo.zoo.reference import (
    compare_with_reference,
    load_reference,
    prediction_interval,
    reference_path,
    student_t_quantile,
)
from openrlhf_hacpo.zoo.reports import format_table


def _t_cdf_by_simpson(t: float, dof: int, n: int = 200_000) -> float:
    """P(T <= t) = 1/2 + ∫_0^t f(x) dx, f(x) = Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) (1 + x²/ν)^(−(ν+1)/2), Simpson's rule."""
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    f = lambda x: c * (1 + x * x / dof) ** (-(dof + 1) / 2)  # noqa: E731
    h = t / n
    total = f(0) + f(t) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 0.5 + total * h / 3


def test_student_t_quantile_against_closed_forms_and_the_density():
    for p in (0.9, 0.975, 0.995):
        assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)    # Cauchy
        assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    for dof in (3, 4, 7, 10):
        q = student_t_quantile(0.975, dof)
        assert _t_cdf_by_simpson(q, dof) == pytest.approx(0.975, abs=1e-9), dof
    assert student_t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)           # printed tables
    z = statistics.NormalDist().inv_cdf(0.975)                   # large ν: z + (z³ + z) / (4ν) + O(ν⁻²)
    assert student_t_quantile(0.975, 3000) == pytest.approx(z + (z**3 + z) / (4 * 3000), abs=1e-6)
    with pytest.raises(ValueError, match="0.5 < p < 1"):
        student_t_quantile(0.4, 3)
    with pytest.raises(ValueError, match="dof"):
        student_t_quantile(0.975, 0)


def test_prediction_interval_by_hand():
    # mean 0.3, s = 0.1, n = 3: half-width t_{0.975, 2} · 0.1 · √(4/3), t_{0.975, 2} = 0.95 / √(2 · 0.975 · 0.025)
    lo, hi = prediction_interval([0.2, 0.3, 0.4])
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * 0.1 * math.sqrt(4 / 3)
    assert (lo, hi) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert prediction_interval([0.5]) is None


AGENTS_USED = {"a": {"fingerprint": "aaaaaaaaaaaa", "source": "shipped"},
               "b": {"fingerprint": "bbbbbbbbbbbb", "source": "shipped"}}
FINALS = {"a": {"0": 0.30, "1": 0.34, "2": 0.26, "3": 0.32, "4": 0.28},
          "b": {"0": 0.50, "1": 0.60, "2": 0.55, "3": 0.45, "4": 0.52}}


def _reference(fingerprints=True, settings=None):
    arm = {"settings": settings or {"algorithm": "hacpo", "n_samples_per_prompt": 8, "extra_args": []},
           "seeds": [0, 1, 2, 3, 4],
           "agents": {n: {"final_by_seed": f, "acc_before": 0.1 if n == "a" else 0.3} for n, f in FINALS.items()}}
    meta = {"agent_fingerprints": {n: {"fingerprint": u["fingerprint"]} for n, u in AGENTS_USED.items()}}
    return {"meta": meta if fingerprints else {"agents": ["a", "b"]}, "arms": {"hacpo": arm}}


def _summary(seed=2, algorithm="hacpo", extra=(), used=AGENTS_USED, finals=(0.31, 0.70)):
    return {"run": {"preset": "model", "algorithm": algorithm, "seed": seed, "steps": 80, "n_samples_per_prompt": 8,
                    "extra_args": list(extra), "agents_used": used},
            "agents": {n: {"acc_before": 0.1, "acc_after": v, "acc_final": v, "rollouts_generated": 10240}
                       for n, v in zip(("a", "b"), finals)}}


def test_comparison_with_the_same_agents_and_arm():
    out = compare_with_reference(_summary(), _reference(), source="tiny_model.json")
    assert out["status"] == "compared" and out["arm"] == "hacpo" and out["seeds"] == [0, 1, 2, 3, 4]
    a, b = out["agents"]["a"], out["agents"]["b"]
    values = list(FINALS["a"].values())
    assert a["ref_mean"] == pytest.approx(0.30) and a["ref_std"] == pytest.approx(math.sqrt(0.001))
    assert (a["ref_min"], a["ref_max"], a["ref_same_seed"]) == (0.26, 0.34, 0.26)
    half = 2.7764451051977987 * statistics.stdev(values) * math.sqrt(1 + 1 / 5)
    assert a["interval"] == [pytest.approx(0.30 - half), pytest.approx(0.30 + half)]
    assert a["typical"] is True
    assert b["ref_mean"] == pytest.approx(0.524) and b["typical"] is False       # 0.70 is far above 0.45-0.60
    table = format_table(_summary(), out)
    assert "README final (5 seeds)" in table and "| a | 0.100 | 0.310 |" in table
    assert "0.300 ± 0.032 | 0.260–0.340 | 0.260 |" in table and table.count("| yes |") == 1
    assert "outside the range expected of one run: b" in table
    assert "agents: a shipped aaaaaaaaaaaa, b shipped bbbbbbbbbbbb" in table
    assert compare_with_reference(_summary(seed=9), _reference())["agents"]["a"]["ref_same_seed"] is None
    # a spread wider than the mean: the interval is cut at accuracy 0
    wide = _reference()
    wide["arms"]["hacpo"]["agents"]["a"]["final_by_seed"] = {"0": 0.0, "1": 0.2, "2": 0.01, "3": 0.15, "4": 0.04}
    low, high = compare_with_reference(_summary(), wide)["agents"]["a"]["interval"]
    assert low == 0.0 and high == pytest.approx(0.08 + 2.7764451051977987 * statistics.stdev(
        [0.0, 0.2, 0.01, 0.15, 0.04]) * math.sqrt(1.2))


def test_comparison_refused_for_other_agents_or_arms():
    old = compare_with_reference(_summary(), _reference(fingerprints=False))
    assert old["status"] == "other_agents" and "earlier agents" in old["note"] and not old["agents"]
    rebuilt = dict(AGENTS_USED, b={"fingerprint": "cccccccccccc", "source": "built"})
    out = compare_with_reference(_summary(used=rebuilt), _reference())
    assert out["status"] == "other_agents" and "b cccccccccccc vs bbbbbbbbbbbb" in out["note"]
    out = compare_with_reference(_summary(extra=("--alpha", "2")), _reference(), source="tiny_model.json")
    assert out["status"] == "no_arm" and "--alpha" in out["note"] and "tiny_model.json" in out["note"]
    table = format_table(_summary(), out)
    assert "README final" not in table and "README comparison: the README reference (tiny_model.json) has no arm" in table


def test_reference_files(tmp_path):
    assert reference_path("model", 80, 80, tmp_path) == tmp_path / "tiny_model.json"
    assert reference_path("state", 20, 80, tmp_path) == tmp_path / "tiny_state_20steps.json"
    ref, why = load_reference(tmp_path / "tiny_model.json")
    assert ref is None and "does not exist" in why
    out = compare_with_reference(_summary(), ref, why)
    assert out["status"] == "no_reference" and out["note"] == why
    (tmp_path / "tiny_model.json").write_text(json.dumps(_reference()))
    ref, why = load_reference(tmp_path / "tiny_model.json")
    assert why is None and compare_with_reference(_summary(), ref)["status"] == "compared"
    assert "installed package" in load_reference(None)[1]


def _compare_module():
    return load_benchmark("compare_tiny", "compare_tiny_for_reference")


def test_compare_tiny_arm_settings_are_what_the_main_job_records(tmp_path):
    from openrlhf_hacpo.cli.tiny import build_parser
    from openrlhf_hacpo.utils.options import split_passthrough
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import MainJobConfig

    compare = _compare_module()
    preset = get_preset("model")
    for name, arm in compare.ARMS.items():
        cmd = compare.run_command(arm, preset, 3, 80, tmp_path / name)
        argv = cmd[cmd.index("run"):]
        own, extra = split_passthrough(argv)
        args = build_parser().parse_args(own)
        cfg = MainJobConfig(preset=args.preset, algorithm=args.algorithm, n_samples_per_prompt=args.n_samples_per_prompt,
                            steps=args.steps, seed=args.seed, output=args.output, extra_args=tuple(extra),
                            regime=args.regime)
        recorded = {"algorithm": cfg.algorithm, "regime": cfg.regime, "n_samples_per_prompt": cfg.group_size,
                    "extra_args": list(extra)}
        assert compare.arm_settings(arm, preset) == recorded, name
    assert "--rebuild" in compare.run_command(compare.ARMS["hacpo"], preset, 0, 80, tmp_path / "r", rebuild=True)


def test_compare_tiny_refuses_runs_of_other_agents(tmp_path):
    from openrlhf_hacpo.zoo import get_preset

    compare = _compare_module()
    preset = get_preset("model")
    arm = compare.ARMS["gspo"]
    out = tmp_path / "gspo" / "seed0"
    out.mkdir(parents=True)
    run = {"preset": "model", "seed": 0, "steps": 80, **compare.arm_settings(arm, preset),
           "agents_used": {"llamaS": {"fingerprint": "111111111111"}, "qwenM": {"fingerprint": "222222222222"}}}
    (out / "summary.json").write_text(json.dumps({"run": run, "agents": {"llamaS": {}, "qwenM": {}}}))
    same = {"llamaS": "111111111111", "qwenM": "222222222222"}
    assert compare.finished(arm, preset, 0, 80, out, same)
    with pytest.raises(ValueError, match="other agents"):
        compare.finished(arm, preset, 0, 80, out, dict(same, qwenM="333333333333"))
