"""The training-inference correction (``LossParams.rollout_is``) fused into hacpo_loss: every mode against the
independent float64 reference of tests/hacpo_reference.py (plain loops), hand-computed cases for the mean over tokens
and for the normaliser rule, and a correction whose weights are all 1 leaving the loss unchanged to the bit."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import hacpo_reference as ref
from hacpo_kernels.hacpo_loss import ROLLOUT_IS_METRIC_NAMES, LossParams, LossTotals, hacpo_loss
from kernel_checks import TRITON_ON_CPU, assert_rel_close, assert_sum_close, generator

B, T = 16, 11
BACKENDS = [("torch", torch.float64, 1e-10), ("torch", torch.float32, 1e-6)] + (
    [("triton", torch.float32, 1e-6)] if TRITON_ON_CPU else [])
"""(backend, dtype, relative tolerance): the twin in float64 and float32, the Triton kernel (interpreted) in
float32; the reference is float64 on the same rounded inputs."""


def _bounds(kw):
    hi = kw.get("rollout_is_threshold", 2.0)
    if kw.get("rollout_is_mode", "truncate") == "truncate":
        return (hi,)
    lower = kw.get("rollout_is_threshold_lower")
    return (hi, lower if lower is not None else 1.0 / hi)


def correction_batch(kw, dtype, salt=0, b=B, t=T):
    """Own and foreign rows with old, engine and current log-probs; every unit's weight at least 1e-3 (relative)
    away from the correction's bounds in ``dtype``'s rounding, so float32 and float64 take the same decisions."""
    g = generator("cpu", salt)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logp + 0.05 * torch.randn(b, t, generator=g, dtype=torch.float64)
    eng = old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    is_own = torch.arange(b) % 2 == 0
    old, eng, logp = (torch.where(mask, x, torch.zeros_like(x)) for x in (old, eng, logp))
    old_mean = old.sum(1) / lengths
    old_mean[~is_own] += 0.05 * torch.randn(int((~is_own).sum()), generator=g, dtype=torch.float64)
    eng_mean = old_mean + 0.25 * torch.randn(b, generator=g, dtype=torch.float64)
    for row, gap in ((0, 0.6), (1, 0.6), (2, -0.6), (3, -0.6)):  # own 0, 2 and foreign 1, 3 beyond every bound
        eng_mean[row] = old_mean[row] - gap
        eng[row, 0] = old[row, 0] - gap
    bounds = _bounds(kw)

    def rounded(x):
        return x.to(dtype).double()

    def near(w):
        return torch.stack([(w - c).abs() < 1e-3 * c for c in bounds]).any(0)

    for _ in range(20):  # shift the engine's values of units near a bound
        w_tok = (rounded(old) - rounded(eng)).exp()
        w_row = (rounded(old_mean) - rounded(eng_mean)).exp()
        bad_tok, bad_row = near(w_tok) & mask, near(w_row)
        if not (bad_tok.any() or bad_row.any()):
            break
        eng = eng + 0.01 * bad_tok
        eng_mean = eng_mean + 0.01 * bad_row
    else:
        raise AssertionError("could not move the weights off the bounds")
    return dict(logp=logp, mask=mask, advantages=torch.randn(b, generator=g, dtype=torch.float64),
                old_logp_mean=old_mean, is_own=is_own, coef=0.5 + torch.rand(b, generator=g, dtype=torch.float64),
                old_logp=old, engine_logp=eng, engine_logp_mean=eng_mean,
                ref_logp=logp + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64))


def expected_metrics(batch, kw):
    """The correction's metrics by hand: over own units (tokens at level token, else rows) and foreign rows, the
    share truncated, the share masked and the mean applied weight."""
    mode, hi, lower = kw["rollout_is_mode"], kw.get("rollout_is_threshold", 2.0), kw.get("rollout_is_threshold_lower")
    low = (lower if lower is not None else 1.0 / hi) if mode == "mask" else -math.inf
    own_w, foreign_w = [], []
    for i in range(len(batch["is_own"])):
        if batch["is_own"][i] and kw["rollout_is_level"] == "token":
            own_w += [math.exp(float(batch["old_logp"][i, t] - batch["engine_logp"][i, t]))
                      for t in range(batch["mask"].shape[1]) if batch["mask"][i, t]]
        else:
            w = math.exp(float(batch["old_logp_mean"][i] - batch["engine_logp_mean"][i]))
            (own_w if batch["is_own"][i] else foreign_w).append(w)
    out = {}
    for side, ws in (("own", own_w), ("foreign", foreign_w)):
        n = max(len(ws), 1)
        out[f"rollout_is_{side}_truncated_frac"] = sum(w > hi for w in ws) / n if mode == "truncate" else 0.0
        out[f"rollout_is_{side}_masked_frac"] = sum(not low <= w <= hi for w in ws) / n if mode == "mask" else 0.0
        out[f"rollout_is_{side}_weight_mean"] = sum(ref.rollout_is_weight(w, mode, hi, lower) for w in ws) / n
    return out


def run(batch, kw, backend, dtype, totals=None):
    """hacpo_loss on ``batch`` with the correction ``kw`` (LossParams fields): (loss, objectives, grad, metrics)."""
    params = LossParams(**kw)
    logp = batch["logp"].to(dtype).detach().requires_grad_()
    out = hacpo_loss(logp, batch["mask"], batch["advantages"].to(dtype), batch["old_logp_mean"].to(dtype),
                     batch["is_own"], batch["coef"].to(dtype), params, old_logp=batch["old_logp"].to(dtype),
                     ref_logp=batch["ref_logp"].to(dtype) if params.kl_coef else None,
                     engine_logp=batch["engine_logp"].to(dtype), engine_logp_mean=batch["engine_logp_mean"].to(dtype),
                     totals=totals or LossTotals(), backend=backend)
    out.loss.backward()
    return out.loss, out.objectives, logp.grad, out.metrics


def reference(batch, kw, dtype):
    """The float64 reference (tests/hacpo_reference.py) on the inputs rounded to ``dtype``."""
    r = {k: (v.to(dtype).double() if v.dtype == torch.float64 else v) for k, v in batch.items()}
    args = {k: v for k, v in kw.items() if k not in ("ratio_level", "update_index")}
    loss, obj, grad, _ = ref.reference_policy_loss(
        r["logp"].tolist(), r["mask"].tolist(), r["advantages"].tolist(), r["old_logp_mean"].tolist(),
        r["is_own"].tolist(), r["coef"].tolist(), token_level=kw.get("ratio_level") == "token",
        old_logp=r["old_logp"].tolist(), ref_logp=r["ref_logp"].tolist() if kw.get("kl_coef") else None,
        engine_logp=r["engine_logp"].tolist(), engine_logp_mean=r["engine_logp_mean"].tolist(), **args)
    return loss, torch.tensor(obj, dtype=torch.float64), torch.tensor(grad, dtype=torch.float64), r


CASES = {
    f"{ratio}-ratio/{level}/{mode}/{agg}": dict(
        ratio_level=ratio, rollout_is=True, rollout_is_level=level, rollout_is_mode=mode, loss_agg=agg,
        rollout_is_threshold=1.25 if mode == "truncate" else 1.3, eps_low=0.2, eps_high=0.28)
    for ratio, level, mode, agg in itertools.product(("sequence", "token"), ("token", "sequence"),
                                                      ("truncate", "mask"), ("seq-mean-token-mean", "token-mean"))
}
CASES.update({
    "sequence-ratio/sequence/mask/lower-bound/gspo-clip": dict(
        rollout_is=True, rollout_is_mode="mask", rollout_is_threshold=1.2, rollout_is_threshold_lower=0.9,
        update_index=2),
    "naive/token/mask/kl": dict(rollout_is=True, rollout_is_level="token", rollout_is_mode="mask",
                                rollout_is_threshold=1.4, foreign_rule="self_clip", kl_coef=0.3),
    "hacpo-pessimistic/token/truncate/kl": dict(rollout_is=True, rollout_is_level="token", rollout_is_threshold=1.1,
                                                cross_clip_mode="pessimistic", kl_coef=0.2, alpha=2.0),
})


@pytest.mark.parametrize("case", list(CASES))
def test_every_mode_matches_the_float64_reference(case):
    """Loss, row objectives, gradient and the correction's metrics; own and foreign rows in every batch."""
    kw = dict(CASES[case])
    kw.setdefault("rollout_is_level", "sequence")
    kw.setdefault("rollout_is_mode", "truncate")
    for backend, dtype, tol in BACKENDS:
        batch = correction_batch(kw, dtype)
        ref_loss, ref_obj, ref_grad, rounded = reference(batch, kw, dtype)
        loss, obj, grad, metrics = run(batch, kw, backend, dtype)
        tag = f"[{case}, {backend}, {dtype}]"
        assert_sum_close(loss, ref_loss, float(ref_obj.abs().mean()), tol, f"loss {tag}")
        assert_rel_close(obj, ref_obj, tol, f"objectives {tag}")
        assert_rel_close(grad, ref_grad, tol, f"grad {tag}")
        want = expected_metrics(rounded, kw)
        assert set(ROLLOUT_IS_METRIC_NAMES) <= set(metrics)
        for name, value in want.items():
            assert float(metrics[name]) == pytest.approx(value, rel=max(tol, 1e-7), abs=1e-7), f"{name} {tag}"
    # the cases reach the bounds: something truncated or masked on both kinds of rows
    cut = "truncated" if kw["rollout_is_mode"] == "truncate" else "masked"
    assert want[f"rollout_is_own_{cut}_frac"] > 0 and want[f"rollout_is_foreign_{cut}_frac"] > 0, want


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_sequence_weight_is_a_mean_over_tokens_not_a_sum(backend):
    """Two foreign rows whose source engine gives every token 0.05 less than the source trainer, one of 2 tokens, one
    of 8: both weigh exp(0.05) = 1.051 (the mean), below C = 1.2; a sum over tokens would give the long row
    exp(0.4) = 1.49, truncated to 1.2, so the weight would grow with length and the truncation would hit long rows."""
    if backend == "triton" and not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    dtype = torch.float64 if backend == "torch" else torch.float32
    mask = torch.tensor([[True] * 2 + [False] * 6, [True] * 8])
    old_tokens = torch.tensor([[-1.0] * 8, [-0.5] * 8], dtype=torch.float64)
    engine_tokens = old_tokens - 0.05
    lengths = mask.sum(1)
    old_mean = (old_tokens * mask).sum(1) / lengths
    engine_mean = (engine_tokens * mask).sum(1) / lengths  # what the learner view computes, over the source's tokens
    logp = old_tokens + 0.0  # s = 1 on both rows: inside the foreign window [0.8, 1]
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    coef = torch.ones(2, dtype=torch.float64)
    own = torch.tensor([False, False])
    params = LossParams(rollout_is=True, rollout_is_threshold=1.2)
    lp = logp.to(dtype).requires_grad_()
    out = hacpo_loss(lp, mask, adv.to(dtype), old_mean.to(dtype), own, coef.to(dtype), params,
                     engine_logp_mean=engine_mean.to(dtype), backend=backend)
    out.loss.backward()
    w = math.exp(0.05)
    assert_rel_close(out.objectives, torch.tensor([w, w], dtype=torch.float64), 1e-6, "row objectives")
    # d loss / d logp_t = -(1/2 rows) * w * s * A / L_i on each token
    want = torch.tensor([[-w / 2 / 2] * 2 + [0.0] * 6, [-w / 2 / 8] * 8], dtype=torch.float64)
    assert_rel_close(lp.grad, want, 1e-6, "gradient")
    assert float(out.metrics["rollout_is_foreign_truncated_frac"]) == 0.0
    assert float(out.metrics["rollout_is_foreign_weight_mean"]) == pytest.approx(w, rel=1e-6)
    assert math.exp(0.05 * 8) > 1.2  # what a sum would have done to the long row


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("ratio_level", ["sequence", "token"])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_masked_units_stay_in_the_denominator(backend, ratio_level, agg):
    """The normaliser rule, by hand: a masked row or token contributes 0 to the sum but keeps its place in D (3 rows
    with seq-mean-token-mean, 6 tokens with token-mean) and, for an own token, in its row's L. Had masked units left
    the denominators, the loss would be -(1 + 2) / 2 rows or -4 / 3 tokens instead of -2 / 3 or -4 / 6."""
    if backend == "triton" and not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    dtype = torch.float64 if backend == "torch" else torch.float32
    # 3 rows of 2 tokens, s = 1 everywhere: own row 0 (A = 1, both tokens kept), own row 1 (A = 2, token 1 masked:
    # w = e > 1.5), foreign row 2 (A = 3, masked: w = 1/e < 1/1.5)
    mask = torch.ones(3, 2, dtype=torch.bool)
    logp = torch.full((3, 2), -1.0, dtype=torch.float64)
    old = logp.clone()
    engine = old.clone()
    engine[1, 1] = old[1, 1] - 1.0
    old_mean = old.mean(1)
    engine_mean = engine.mean(1)
    engine_mean[2] = old_mean[2] + 1.0
    adv = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    own = torch.tensor([True, True, False])
    params = LossParams(rollout_is=True, rollout_is_level="token", rollout_is_mode="mask", rollout_is_threshold=1.5,
                        loss_agg=agg, ratio_level=ratio_level, eps_low=0.2, eps_high=0.28)
    lp = logp.to(dtype).requires_grad_()
    out = hacpo_loss(lp, mask, adv.to(dtype), old_mean.to(dtype), own, torch.ones(3, dtype=dtype), params,
                     old_logp=old.to(dtype), engine_logp=engine.to(dtype), engine_logp_mean=engine_mean.to(dtype),
                     backend=backend)
    out.loss.backward()
    # row objectives: row 0 A = 1; row 1 (2 + 0) / 2 = 1 (its L stays 2); row 2: 0
    assert_rel_close(out.objectives, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), 1e-6, "objectives")
    want_loss = -2.0 / 3 if agg == "seq-mean-token-mean" else -(1 + 1 + 2 + 0) / 6
    assert float(out.loss.detach()) == pytest.approx(want_loss, rel=1e-6)
    # gradient: -(1/D) · (1/L with seq-mean-token-mean, else 1) · d obj / d logp_t, d obj / d ell = rho · A at s = 1
    scale = 1 / 3 / 2 if agg == "seq-mean-token-mean" else 1 / 6
    if ratio_level == "token":  # per token: rho_t · A
        want = [[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]
    else:  # the row's mean weight times A, spread over its tokens (L · 1/L with token-mean)
        row = [1.0, 0.5 * 2.0, 0.0] if agg == "token-mean" else [1.0 * 2 / 2, 0.5 * 2.0 * 2 / 2, 0.0]
        want = [[r, r] for r in row]
    assert_rel_close(lp.grad, -scale * torch.tensor(want, dtype=torch.float64), 1e-6, "gradient")
    assert float(out.metrics["rollout_is_own_masked_frac"]) == pytest.approx(0.25)  # 1 of 4 own tokens
    assert float(out.metrics["rollout_is_own_weight_mean"]) == pytest.approx(0.75)
    assert float(out.metrics["rollout_is_foreign_masked_frac"]) == pytest.approx(1.0)
    assert float(out.metrics["rollout_is_foreign_weight_mean"]) == 0.0


def test_all_ones_weights_leave_the_loss_unchanged_to_the_bit():
    """Engine log-probs equal to the old ones (w = 1 on every unit): the corrected loss is the uncorrected one, bit
    for bit, on both backends and every level and mode."""
    for backend, dtype, _ in BACKENDS:
        batch = correction_batch(dict(rollout_is_mode="truncate"), dtype, salt=3)
        batch["engine_logp"] = batch["old_logp"].clone()
        batch["engine_logp_mean"] = batch["old_logp_mean"].clone()
        for ratio, level, mode in itertools.product(("sequence", "token"), ("sequence", "token"),
                                                    ("truncate", "mask")):
            base = dict(ratio_level=ratio, eps_low=0.2, eps_high=0.28)
            off = run(batch, base, backend, dtype)
            on = run(batch, dict(base, rollout_is=True, rollout_is_level=level, rollout_is_mode=mode), backend,
                     dtype)
            tag = f"[{backend}, {dtype}, {ratio}, {level}, {mode}]"
            for name, a, b in zip(("loss", "objectives", "grad"), off[:3], on[:3]):
                assert torch.equal(a, b), f"{name} {tag}"
            assert not set(ROLLOUT_IS_METRIC_NAMES) & set(off[3]), "metrics of a correction that is off"
            assert float(on[3]["rollout_is_own_weight_mean"]) == 1.0


def test_micro_batches_add_up_with_the_correction():
    """With the mini-batch totals as denominators, micro-batch losses and gradients add up to the whole batch's,
    masked units included (the rule that lets the update split rows and the probe skip them)."""
    kw = dict(rollout_is=True, rollout_is_level="token", rollout_is_mode="mask", rollout_is_threshold=1.3,
              loss_agg="token-mean")
    batch = correction_batch(kw, torch.float64, salt=5, b=20)
    totals = LossTotals(num_seqs=20, num_tokens=int(batch["mask"].sum()))
    whole = run(batch, kw, "torch", torch.float64, totals)
    parts = [run({k: v[s:s + 7] for k, v in batch.items()}, kw, "torch", torch.float64, totals)
             for s in range(0, 20, 7)]
    assert float(sum(p[0].detach() for p in parts)) == pytest.approx(float(whole[0].detach()), rel=1e-12, abs=1e-14)
    assert_rel_close(torch.cat([p[2] for p in parts]), whole[2], 1e-12, "micro-batch gradients")


def test_bad_settings_raise_clear_errors():
    batch = correction_batch(dict(), torch.float64)
    args = (batch["logp"], batch["mask"], batch["advantages"], batch["old_logp_mean"], batch["is_own"], batch["coef"])
    with pytest.raises(ValueError, match="engine_logp_mean"):
        hacpo_loss(*args, LossParams(rollout_is=True))
    with pytest.raises(ValueError, match="engine_logp"):
        hacpo_loss(*args, LossParams(rollout_is=True, rollout_is_level="token"), old_logp=batch["old_logp"],
                   engine_logp_mean=batch["engine_logp_mean"])
    for kw, message in (
            (dict(rollout_is_mode="mask"), r"LossParams\.rollout_is_mode = 'mask' sets the training-inference "
                                           r"correction, which is off: turn it on with LossParams\.rollout_is"),
            (dict(rollout_is=True, rollout_is_threshold=0.5), r"LossParams\.rollout_is_threshold must be >= 1"),
            (dict(rollout_is=True, rollout_is_level="row"), r"LossParams\.rollout_is_level must be one of"),
            (dict(rollout_is=True, rollout_is_mode="clip"), r"LossParams\.rollout_is_mode must be one of"),
            (dict(rollout_is=True, rollout_is_threshold_lower=0.5), r"rollout_is_threshold_lower = 0\.5 is a bound "
                                                                    r"of the mask mode"),
            (dict(rollout_is=True, rollout_is_mode="mask", rollout_is_threshold_lower=1.5),
             r"rollout_is_threshold_lower must be in \(0, 1\]"),
            (dict(rollout_is=True, rollout_is_mode="mask", rollout_is_threshold=1.0),
             r"rollout_is_threshold must be > 1 in mask mode"),
            (dict(rollout_is="yes"), r"LossParams\.rollout_is must be a bool")):
        with pytest.raises(ValueError, match=message):
            LossParams(**kw)
