"""The benchmarks run end to end on tiny shapes, and the loss benchmark's op-by-op baseline is the HACPO loss.

The baseline check compares :func:`unfused_hacpo_loss` (plain torch ops) with a float64 evaluation of the same
formulas written out per row in Python, and its gradient with autograd on that float64 reference.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_kernels  # noqa: E402
import bench_step  # noqa: E402


def _row_objective(lp, mask, old_mean, adv, own, coef, hp):
    """HACPO sequence objective of one row in float64 Python scalars (eqs. 10-14, 47-49)."""
    length = sum(mask)
    ell = sum(l * m for l, m in zip(lp, mask)) / length - old_mean
    ell = max(-hp["log_ratio_clip"], min(hp["log_ratio_clip"], ell))
    s = math.exp(ell)
    if own:
        return min(s * adv, min(max(s, 1 - hp["eps_low"]), 1 + hp["eps_high"]) * adv)
    lo = min(1.0, 1 - hp["delta"] + hp["update_index"] * hp["delta_step"])
    c = min(max(s, lo), 1.0)
    return c * c ** hp["alpha"] * coef * adv


def test_unfused_baseline_matches_float64_formulas():
    x = bench_kernels.make_loss_inputs(4, 16, "cpu", seed=3)
    hp = bench_kernels.LOSS_HP
    loss = bench_kernels.unfused_hacpo_loss(x, **hp)

    lp, mask, ref = x.logp.detach().double().tolist(), x.mask.tolist(), x.ref_logp.double().tolist()
    objs, kls = [], []
    for i in range(4):
        own = bool(x.is_own[i])
        objs.append(_row_objective(lp[i], mask[i], float(x.old_logp_mean[i]), float(x.advantages[i]), own,
                                   float(x.coef[i]), hp))
        if own:
            d = [max(-20.0, min(20.0, r - l)) for r, l in zip(ref[i], lp[i])]
            kls.append(sum((math.exp(v) - v - 1) * m for v, m in zip(d, mask[i])) / sum(mask[i]))
    expected = -sum(objs) / 4 + hp["kl_coef"] * sum(kls) / len(kls)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)

    # gradient: float64 autograd of the same inputs, against the fp32 baseline
    loss.backward()
    x64 = bench_kernels.LossInputs(x.logp.detach().double().requires_grad_(), x.mask.double(), x.ref_logp.double(),
                                   x.advantages.double(), x.old_logp_mean.double(), x.is_own, x.coef.double())
    bench_kernels.unfused_hacpo_loss(x64, **hp).backward()
    torch.testing.assert_close(x.logp.grad.double(), x64.logp.grad, rtol=1e-4, atol=1e-7)


def test_loss_floor_bytes_counts_reads_and_the_gradient_write():
    x = bench_kernels.make_loss_inputs(2, 8, "cpu")
    rows = 2 * 17  # 4 fp32 row vectors + a bool per row
    assert x.floor_bytes(False) == 3 * 4 * 16 + rows  # read logp, mask, ref_logp
    assert x.floor_bytes(True) == 2 * (3 * 4 * 16 + rows) + 4 * 16  # read twice, write d logp
    assert x.one_read_bytes() == 4 * 4 * 16 + rows


@pytest.mark.integration  # runs a benchmark's main on real shapes (seconds)
def test_tune_loss_tiles_flags_a_tile_that_disagrees_with_the_twin(monkeypatch):
    """The sweep's correctness check accepts the shipped and a small tile, and fails when the two backends compute
    different losses (here: the twin given a wider foreign window)."""
    import importlib

    tune = importlib.import_module("tune_loss_tiles")
    loss_module = tune.loss_module
    if not loss_module.is_interpreted(loss_module._hacpo_fwd_kernel) and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or CUDA")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(tune, "kernel_ms", lambda fn, names, reps=20: (fn(), dict.fromkeys(names, 0.0))[1])
    monkeypatch.setattr(loss_module, "INTERPRETER_TILES", None)
    x = bench_kernels.make_loss_inputs(6, 40, device)
    assert tune.run_case(x, (1, 2048, 4), (2, 1024, 4))["matches_twin"]
    assert tune.run_case(x, (4, 16, 4), (1, 32, 4))["matches_twin"]
    real = loss_module._hacpo_loss_torch

    def twin_with_a_wider_window(*args, **kwargs):  # foreign rows above 1 keep their ratio and their gradient
        params, totals = args[-2:]
        return real(*args[:-2], dataclasses.replace(params, cross_clip_high=params.hi + 0.5), totals, **kwargs)

    monkeypatch.setattr(loss_module, "_hacpo_loss_torch", twin_with_a_wider_window)
    assert not tune.run_case(x, (1, 2048, 4), (2, 1024, 4))["matches_twin"]


@pytest.mark.integration  # runs a benchmark's main on real shapes (seconds)
def test_bench_kernels_loss_section_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_kernels, "RESULTS_DIR", tmp_path)
    assert bench_kernels.main(["--only", "loss", "--cpu-small", "--quick", "--loss-shapes", "2x64,1x128",
                               "--out", "loss_smoke"]) == 0
    payload = json.loads((tmp_path / "loss_smoke.json").read_text())
    rows = payload["rows"]
    assert {r["section"] for r in rows} == {"loss"}
    assert {(r["path"], r["n"], r["v"]) for r in rows} == {
        (p, 128, t) for p in ("unfused", "torch_twin") for t in (64, 128)}
    assert all(r["fwd_ms"] > 0 and r["step_ms"] > 0 and not r["note"] for r in rows)
    assert "## loss" in (tmp_path / "loss_smoke.md").read_text()


def test_bench_kernels_flags_exclude_each_other(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_kernels, "RESULTS_DIR", tmp_path)
    with pytest.raises(SystemExit):
        bench_kernels.main(["--only", "loss", "--no-loss"])


@pytest.mark.integration  # runs a benchmark's main on real shapes (seconds)
def test_bench_step_runs_both_models_and_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_step, "RESULTS_DIR", tmp_path)
    assert bench_step.main(["--cpu", "--quick", "--in-process", "--vocab", "4096", "--large-shape", "2x4x8",
                            "--zoo-shape", "2x4x8", "--out", "step_smoke"]) == 0
    payload = json.loads((tmp_path / "step_smoke.json").read_text())
    got = {(r["model"], r["pass_name"], r["path"]) for r in payload["results"]}
    assert got == {(m, p, q) for m in bench_step.MODELS for p in bench_step.PASSES for q in bench_step.PATHS}
    assert all(r["seconds"] > 0 and r["tokens"] == 16 and not r["note"] for r in payload["results"])
    assert {r["vocab"] for r in payload["results"] if r["model"] == "large_vocab"} == {4096}
    assert len(payload["ratios"]) == 4
    assert "Command: `python" in (tmp_path / "step_smoke.md").read_text()


@pytest.mark.parametrize("flags", [["--passes", "train"], ["--models", "gpt"]])
def test_bench_step_rejects_unknown_models_and_passes(flags):
    with pytest.raises(SystemExit):
        bench_step.main(flags)
