"""hacpo_loss: golden float64 cases, Triton vs float64 twin on random inputs, algorithm-core parity."""
from __future__ import annotations

import json
import math

import pytest
import torch

from kernel_checks import (DEVICES, TRITON_ON_CPU, assert_finite, assert_rel_close, assert_sum_close,
                           hacpo_loss_kw, poisoned_allocations, skip_unless_runnable)
from hacpo_kernels import METRIC_NAMES, LossParams, LossTotals, cross_clip_lower_bound, hacpo_loss

GOLDEN_ATOL = 1e-9


@pytest.fixture(scope="module")
def golden_cases(testdata_dir):
    with open(testdata_dir / "hacpo_golden.json", encoding="utf-8") as f:
        return json.load(f)["cases"]


def golden_call(case, backend, dtype, device="cpu"):
    i, e = case["inputs"], case["expected"]
    logp = torch.tensor(i["logp_new"], dtype=dtype, device=device, requires_grad=True)
    with poisoned_allocations():
        loss, obj, _, metrics, _ = hacpo_loss_kw(
            logp,
            torch.tensor(i["mask_new"], device=device),
            torch.tensor(e["advantages"], dtype=dtype, device=device),
            torch.tensor(i["old_logp_mean"], dtype=dtype, device=device),
            torch.tensor(i["is_own"], device=device),
            torch.tensor(e["coefficients"], dtype=dtype, device=device),
            update_index=i["m"], eps_low=i["eps_low"], eps_high=i["eps_high"], delta=i["delta"],
            delta_step=i["delta_step"], alpha=i["alpha"], log_ratio_clip=i["log_ratio_clip"],
            log_ratio_clip_mode="symmetric", backend=backend,
        )
        loss.backward()
    return loss, obj, logp.grad, metrics


def test_golden_cases_torch_twin_float64(golden_cases):
    assert len(golden_cases) == 40
    for k, case in enumerate(golden_cases):
        e = case["expected"]
        loss, obj, grad, _ = golden_call(case, "torch", torch.float64)
        assert loss.dtype == torch.float64
        assert abs(loss.item() - float(e["loss"])) <= GOLDEN_ATOL, f"case {k}: loss {float(loss)} vs {e['loss']}"
        torch.testing.assert_close(obj, torch.tensor(e["objectives"], dtype=torch.float64), atol=GOLDEN_ATOL, rtol=0,
                                   msg=lambda m: f"case {k} objectives: {m}")
        torch.testing.assert_close(grad, torch.tensor(e["grad"], dtype=torch.float64), atol=GOLDEN_ATOL, rtol=0,
                                   msg=lambda m: f"case {k} grad: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_golden_cases_triton_float32(golden_cases, device):
    skip_unless_runnable("triton", device)
    for k, case in enumerate(golden_cases):
        e = case["expected"]
        loss, obj, grad, metrics = golden_call(case, "triton", torch.float32, device)
        assert loss.dtype == torch.float32 and grad.dtype == torch.float32
        ref_obj = torch.tensor(e["objectives"], dtype=torch.float64)
        assert_sum_close(loss, float(e["loss"]), float(ref_obj.abs().mean()), 1e-5, f"case {k} loss")
        assert_rel_close(obj, ref_obj, 1e-5, f"case {k} objectives")
        ref_grad = torch.tensor(e["grad"], dtype=torch.float64)
        if float(ref_grad.norm()) > 0:
            assert_rel_close(grad, ref_grad, 1e-5, f"case {k} grad")
        else:
            assert torch.all(grad == 0), f"case {k}: expected an all-zero gradient"
        for name in METRIC_NAMES:
            assert_finite(metrics[name], name)


def random_batch(device, b=23, t=19, *, own_frac=0.5, spread=0.3, empty_rows=0):
    """Random micro-batch: ratios spread around the clip windows, ragged masks, some padding set to NaN."""
    lengths = torch.randint(1, t + 1, (b,), device=device)
    if empty_rows:
        lengths[:empty_rows] = 0
    mask = torch.arange(t, device=device)[None, :] < lengths[:, None]
    logp = -torch.rand(b, t, device=device, dtype=torch.float64) * 3
    old_logp = logp + torch.randn(b, t, device=device, dtype=torch.float64) * spread
    lf = mask.double()
    old_mean = (logp * lf).sum(1) / lf.sum(1).clamp(min=1) + torch.randn(b, device=device, dtype=torch.float64) * spread
    is_own = torch.rand(b, device=device) < own_frac
    coef = torch.where(is_own, 1.0, torch.exp(torch.randn(b, device=device, dtype=torch.float64)))
    adv = torch.randn(b, device=device, dtype=torch.float64)
    logp = torch.where(mask, logp, torch.full_like(logp, float("nan")))  # padding is never read
    return dict(logp=logp, mask=mask, advantages=adv, old_logp_mean=old_mean, is_own=is_own, coef=coef,
                old_logp=old_logp)


VARIANTS = {
    "default": {},
    "upper_clip": dict(log_ratio_clip=0.05, log_ratio_clip_mode="upper"),
    "symmetric_tight_clip": dict(log_ratio_clip=0.05),
    "no_log_clip": dict(log_ratio_clip=None),
    "no_cross_clip": dict(cross_clip=False, alpha=2.0),
    "window_above_one": dict(cross_clip_high=1.3, alpha=2.0),
    "pessimistic": dict(cross_clip_mode="pessimistic", update_index=2, cross_clip_dual=1.2),
    "pessimistic_token_level": dict(cross_clip_mode="pessimistic", ratio_level="token", cross_clip_high=1.1),
    "not_stepwise": dict(stepwise=False, update_index=3, delta=0.1),
    "late_step": dict(update_index=5, delta_step=0.03, alpha=0.0),
    "token_mean": dict(loss_agg="token-mean", num_tokens=400),
    "num_seqs": dict(num_seqs=64),
    "wide_self_clip": dict(eps_low=0.2, eps_high=0.28),
    "token_level": dict(ratio_level="token", eps_low=0.2, eps_high=0.28),
    "token_level_token_mean": dict(ratio_level="token", loss_agg="token-mean", log_ratio_clip=0.1),
}


def call(batch, backend, dtype, mask_dtype=torch.bool, **kw):
    logp = batch["logp"].to(dtype).detach().requires_grad_()
    token_level = kw.get("ratio_level") == "token"
    with poisoned_allocations():
        loss, obj, _, metrics, _ = hacpo_loss_kw(
            logp, batch["mask"].to(mask_dtype), batch["advantages"].to(dtype),
            None if token_level else batch["old_logp_mean"].to(dtype), batch["is_own"], batch["coef"].to(dtype),
            old_logp=batch["old_logp"].to(dtype) if token_level else None, backend=backend, **kw,
        )
        loss.backward()
    return loss, obj, logp.grad, metrics


def move_off_log_ratio_clip(batch, kw, margin=1e-3, shift=0.02):
    """Shift the old log-probs of units whose log-ratio (on bf16-rounded inputs) lies within ``margin`` of the
    log-ratio clamp ±C, so that float32 and float64 arithmetic agree on which side of the clamp they are."""
    clip = kw.get("log_ratio_clip", 10.0)
    if clip is None:
        return batch
    mask = batch["mask"]
    logp = torch.where(mask, batch["logp"], torch.zeros_like(batch["logp"])).to(torch.bfloat16).double()
    if kw.get("ratio_level") == "token":
        ell = logp - batch["old_logp"].to(torch.bfloat16).double()
        near = mask & ((ell.abs() - clip).abs() < margin)
        batch["old_logp"] = batch["old_logp"] + near * shift
    else:
        lengths = mask.sum(1).clamp(min=1)
        ell = logp.sum(1) / lengths - batch["old_logp_mean"].to(torch.bfloat16).double()
        near = (ell.abs() - clip).abs() < margin
        batch["old_logp_mean"] = batch["old_logp_mean"] + near * shift
    return batch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_triton_matches_float64_twin(device, variant):
    skip_unless_runnable("triton", device)
    kw = VARIANTS[variant]
    batch = random_batch(device, empty_rows=2 if variant in ("default", "token_level") else 0)
    batch = move_off_log_ratio_clip(batch, kw)
    for backend, dtype, tol in (("triton", torch.float32, 1e-5), ("torch", torch.float32, 1e-5),
                                ("triton", torch.bfloat16, 1e-2)):
        # reference: float64 math on the same (rounded) inputs, so no clip decision flips through rounding
        rounded = {k: v.to(dtype).double() if v.dtype == torch.float64 else v for k, v in batch.items()}
        ref_loss, ref_obj, ref_grad, ref_metrics = call(rounded, "torch", torch.float64, **kw)
        assert_finite(ref_grad, "twin grad")
        assert torch.all(ref_grad[~batch["mask"]] == 0)
        loss, obj, grad, metrics = call(batch, backend, dtype, mask_dtype=torch.float32, **kw)
        tag = f"[{variant},{backend},{dtype}]"
        assert_sum_close(loss, ref_loss, float(ref_obj.abs().mean()) + 1e-12, tol, f"loss {tag}")
        assert_rel_close(obj, ref_obj, tol, f"objectives {tag}")
        assert grad.dtype == dtype
        assert_rel_close(grad, ref_grad, tol, f"grad {tag}")
        if dtype == torch.float32:
            for name in METRIC_NAMES:
                got, want = float(metrics[name]), float(ref_metrics[name])
                assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), f"metric {name} {tag}: {got} vs {want}"


@pytest.mark.parametrize("variant", ["default", "token_level", "pessimistic", "token_mean"])
def test_gpu_launch_tiles_match_the_float64_twin(monkeypatch, variant):
    """The launch tiles the GPU uses (FWD_TILE, BWD_TILE) run here too, rows longer than one forward step."""
    import importlib

    module = importlib.import_module("hacpo_kernels.hacpo_loss")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    skip_unless_runnable("triton", device)
    monkeypatch.setattr(module, "INTERPRETER_TILES", None)
    t = module.FWD_TILE[1] + 37  # two forward steps per row, a ragged last one
    kw = VARIANTS[variant]
    batch = move_off_log_ratio_clip(random_batch(device, b=5, t=t, empty_rows=1), kw)
    rounded = {k: v.float().double() if v.dtype == torch.float64 else v for k, v in batch.items()}
    ref_loss, ref_obj, ref_grad, ref_metrics = call(rounded, "torch", torch.float64, **kw)
    loss, obj, grad, metrics = call(batch, "triton", torch.float32, mask_dtype=torch.float32, **kw)
    assert_sum_close(loss, ref_loss, float(ref_obj.abs().mean()) + 1e-12, 1e-5, f"loss [{variant}]")
    assert_rel_close(obj, ref_obj, 1e-5, f"objectives [{variant}]")
    assert_rel_close(grad, ref_grad, 1e-5, f"grad [{variant}]")
    for name in METRIC_NAMES:
        assert abs(float(metrics[name]) - float(ref_metrics[name])) <= 1e-5 * max(1.0, abs(float(ref_metrics[name])))


def test_metrics_count_what_they_say():
    """Hand-built rows: own ratios below/inside/above [1-eps_low, 1+eps_high], foreign below/inside/above [lo, 1]."""
    log_s = torch.tensor([math.log(0.5), 0.0, math.log(1.5), math.log(0.5), math.log(0.9), math.log(1.2)],
                         dtype=torch.float64)
    is_own = torch.tensor([True, True, True, False, False, False])
    logp = log_s[:, None].repeat(1, 2).requires_grad_()
    mask = torch.ones(6, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    coef = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], dtype=torch.float64)
    for backend in ("torch", "triton") if TRITON_ON_CPU else ("torch",):
        dtype = torch.float64 if backend == "torch" else torch.float32
        lp = logp.detach().to(dtype).requires_grad_()
        loss, obj, _, m, _ = hacpo_loss_kw(lp, mask, adv.to(dtype), torch.zeros(6, dtype=dtype), is_own, coef.to(dtype),
                                  update_index=0, alpha=1.0, backend=backend)
        loss.backward()
        assert float(m["own_clip_frac_lower"]) == pytest.approx(1 / 3)
        assert float(m["own_clip_frac_upper"]) == pytest.approx(1 / 3)
        assert float(m["foreign_clip_frac_lower"]) == pytest.approx(1 / 3)
        assert float(m["foreign_clip_frac_upper"]) == pytest.approx(1 / 3)
        assert float(m["foreign_in_window_frac"]) == pytest.approx(1 / 3)
        assert float(m["own_ratio_mean"]) == pytest.approx((0.5 + 1.0 + 1.5) / 3, rel=1e-6)
        assert float(m["num_own"]) == 3 and float(m["num_foreign"]) == 3
        # objectives by hand: own min(sA, clip(s)A); foreign clamp(s, 0.8, 1)^2 * 0.5 * 2
        expected = torch.tensor([0.5, 1.0, -1.5, 0.8**2, 0.9**2, 1.0], dtype=torch.float64)
        assert_rel_close(obj, expected, 1e-6, f"hand objectives [{backend}]")
        # gradient per token (2 tokens, 6 rows): -(1/6) * d obj/d ell / 2; zero where clipped/outside window
        d = torch.tensor([0.5, 1.0, -1.5, 0.0, 0.9**2, 0.0], dtype=torch.float64)
        assert_rel_close(lp.grad, (-d / 12)[:, None].repeat(1, 2), 1e-6, f"hand grad [{backend}]")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_micro_batches_add_up_to_the_mini_batch(backend, agg):
    skip_unless_runnable(backend, "cpu")
    batch = random_batch("cpu", b=20)
    total_tokens = int(batch["mask"].sum())
    kw = dict(loss_agg=agg, num_seqs=20, num_tokens=total_tokens, update_index=1, backend=backend)
    dtype = torch.float64 if backend == "torch" else torch.float32
    full = call(batch, backend, dtype, **{k: v for k, v in kw.items() if k != "backend"})
    parts = [call({k: v[s:s + 7] for k, v in batch.items()}, backend, dtype,
                  **{k: v for k, v in kw.items() if k != "backend"}) for s in range(0, 20, 7)]
    scale = float(full[1].abs().mean())
    assert_sum_close(sum(p[0] for p in parts), full[0], scale, 1e-6, "sum of micro-batch losses")
    assert_rel_close(torch.cat([p[2] for p in parts]), full[2], 1e-6, "micro-batch gradients")


def test_cross_clip_lower_bound():
    assert cross_clip_lower_bound(0.2, 0.025, 0) == pytest.approx(0.8)
    assert cross_clip_lower_bound(0.2, 0.025, 3) == pytest.approx(0.875)
    assert cross_clip_lower_bound(0.2, 0.025, 100) == 1.0
    assert cross_clip_lower_bound(0.2, 0.025, 3, stepwise=False) == pytest.approx(0.8)


def test_bad_inputs_raise_clear_errors():
    b = random_batch("cpu", b=4, t=3)
    args = (b["logp"], b["mask"], b["advantages"], b["old_logp_mean"], b["is_own"], b["coef"])
    with pytest.raises(ValueError, match="mask must have shape"):
        hacpo_loss(b["logp"], b["mask"][:, :2], *args[2:])
    with pytest.raises(ValueError, match="advantages must have shape"):
        hacpo_loss(*args[:2], b["advantages"][:3], *args[3:])
    with pytest.raises(ValueError, match="old_logp"):
        hacpo_loss(*args, LossParams(ratio_level="token"))
    with pytest.raises(TypeError, match="LossParams"):
        hacpo_loss(*args, {"delta": 0.1})
    with pytest.raises(ValueError, match=r"LossTotals\.num_seqs must be an int >= 1"):
        LossTotals(num_seqs=0)
    for kw, message in ((dict(loss_agg="sum"), r"LossParams\.loss_agg must be one of"),
                        (dict(delta=1.5), r"LossParams\.delta must be <= 1"),
                        (dict(cross_clip_high=0.9), r"LossParams\.cross_clip_high must be >= 1"),
                        (dict(cross_clip_mode="min"), "cross_clip_mode"),
                        (dict(cross_clip_mode="pessimistic", cross_clip_dual=0.9), "cross_clip_dual"),
                        (dict(update_index=-1), "update_index"),
                        (dict(dual_clip_c=1.0), r"LossParams\.dual_clip_c must be > 1 \+ eps_high"),
                        (dict(log_ratio_clip_mode="lower"), "log_ratio_clip_mode")):
        with pytest.raises(ValueError, match=message):
            LossParams(**kw)


# --------------------------------------------------------------------------------------------------------------
# every loss variant the trainer accepts against the independent float64 reference (python loops, no autograd)
# --------------------------------------------------------------------------------------------------------------
REFERENCE_CASES = {
    "hacpo": dict(),
    "hacpo_upper_clip": dict(log_ratio_clip=0.05, log_ratio_clip_mode="upper", update_index=2),
    "hacpo_no_clip": dict(cross_clip=False, alpha=0.5),
    "hacpo_window_above_one": dict(cross_clip_high=1.2, update_index=1),
    "hacpo_pessimistic": dict(cross_clip_mode="pessimistic", alpha=2.0, cross_clip_dual=1.15),
    "hacpo_pessimistic_token": dict(cross_clip_mode="pessimistic", ratio_level="token", loss_agg="token-mean"),
    "hacpo_token": dict(ratio_level="token", cross_clip_high=1.15),
    "hacpo_not_stepwise": dict(stepwise=False, update_index=4),
    "hacpo_token_mean": dict(loss_agg="token-mean", num_tokens=300),
    "hacpo_kl": dict(kl_coef=0.3, num_seqs=40, num_own_seqs=19),
    "hacpo_kl_token_mean": dict(kl_coef=0.5, loss_agg="token-mean"),
    "hacpo_token_kl": dict(ratio_level="token", kl_coef=0.2, eps_low=0.2, eps_high=0.28),
    "naive": dict(foreign_rule="self_clip"),
    "naive_kl_token_mean": dict(foreign_rule="self_clip", kl_coef=0.1, loss_agg="token-mean", num_own_tokens=90),
    "gspo_own_only": dict(own_only=True, kl_coef=0.001),
    "grpo_own_only": dict(own_only=True, ratio_level="token", eps_low=0.2, eps_high=0.28, kl_coef=0.04),
}


def _reference_of(batch, kw):
    import hacpo_reference as ref  # tests/hacpo_reference.py (tests/ is on sys.path through tests/conftest.py)

    mask = batch["mask"].tolist()
    token_level = kw.get("ratio_level") == "token"
    names = {"update_index": "m"}
    skip = {"ratio_level", "own_only"}
    args = {names.get(k, k): v for k, v in kw.items() if k not in skip}
    logp = torch.where(batch["mask"], batch["logp"], torch.zeros_like(batch["logp"]))
    return ref.reference_policy_loss(
        logp.tolist(), mask, batch["advantages"].tolist(), batch["old_logp_mean"].tolist(), batch["is_own"].tolist(),
        batch["coef"].tolist(), token_level=token_level, old_logp=batch["old_logp"].tolist(),
        ref_logp=batch["ref_logp"].tolist() if kw.get("kl_coef") else None, **args)


@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_matches_float64_reference(case):
    kw = dict(REFERENCE_CASES[case])
    batch = random_batch("cpu", b=16, t=11, own_frac=1.0 if kw.get("own_only") else 0.5)
    batch["ref_logp"] = batch["logp"].nan_to_num(0.0) + torch.randn(16, 11, dtype=torch.float64) * 0.4
    ref_loss, ref_obj, ref_grad, ref_kl = _reference_of(batch, kw)
    ref_grad = torch.tensor(ref_grad, dtype=torch.float64)
    call_kw = {k: v for k, v in kw.items() if k != "own_only"}
    token_level = call_kw.get("ratio_level") == "token"
    for backend, dtype, tol in (("torch", torch.float64, 1e-10), ("triton", torch.float32, 1e-5)):
        if backend == "triton" and not TRITON_ON_CPU:
            continue
        logp = batch["logp"].to(dtype).detach().requires_grad_()
        out = hacpo_loss_kw(
            logp, batch["mask"], batch["advantages"].to(dtype), None if token_level else batch["old_logp_mean"].to(dtype),
            batch["is_own"], batch["coef"].to(dtype), old_logp=batch["old_logp"].to(dtype) if token_level else None,
            ref_logp=batch["ref_logp"].to(dtype) if kw.get("kl_coef") else None, backend=backend, **call_kw)
        out.loss.backward()
        tag = f"[{case}, {backend}]"
        assert_sum_close(out.loss, ref_loss, float(torch.tensor(ref_obj).abs().mean()), tol, f"loss {tag}")
        assert_rel_close(out.objectives, torch.tensor(ref_obj, dtype=torch.float64), tol, f"objectives {tag}")
        assert_rel_close(logp.grad, ref_grad, tol, f"grad {tag}")
        if kw.get("kl_coef"):
            assert float(out.metrics["kl"]) == pytest.approx(ref_kl, rel=tol * 10, abs=1e-12), tag
