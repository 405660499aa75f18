"""GRPO's dual clip and the clamped low-variance KL, both backends, against float64 values computed by hand.

References (verl ``core_algos``): the PPO/GRPO loss bounds a negative-advantage token's objective below at
``c·A`` (``clip_ratio_c = 3``): ``obj = max(min(wA, clip(w, 1-ε_l, 1+ε_h)A), cA)`` for ``A < 0``; ``low_var_kl``
clamps ``d = ref - logp`` to ±20 and then ``k3 = e^d - d - 1`` to [-10, 10]. Outside either clamp the gradient is 0.
"""
from __future__ import annotations

import math

import pytest
import torch

from kernel_checks import TRITON_ON_CPU, assert_rel_close, assert_sum_close
from hacpo_kernels import LossParams, hacpo_loss
from openrlhf_hacpo.algorithms import PolicyLossConfig, PolicyLossInput, get_policy_loss

BACKENDS = [("torch", torch.float64, 1e-12)] + ([("triton", torch.float32, 1e-5)] if TRITON_ON_CPU else [])

# token ratios w and advantages: below the clip, inside, above it, above c = 3, far above c
RATIOS = [0.5, 1.1, 2.0, 3.5, 6.0]
EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0


def grpo_token_reference(w: float, a: float, c: float | None) -> tuple[float, float]:
    """(objective, d objective / d log w) of one token, plain float64 math."""
    clipped = min(max(w, 1 - EPS_LOW), 1 + EPS_HIGH)
    unclipped_wins = w * a <= clipped * a
    obj = min(w * a, clipped * a)
    grad = w * a if unclipped_wins else 0.0
    if c is not None and a < 0 and c * a > obj:
        obj, grad = c * a, 0.0
    return obj, grad


@pytest.mark.parametrize("backend,dtype,tol", BACKENDS)
@pytest.mark.parametrize("dual", [C, None])
def test_grpo_dual_clip_matches_the_hand_reference(backend, dtype, tol, dual):
    advantages = [1.0, -1.0]
    old = torch.full((2, len(RATIOS)), -1.0, dtype=torch.float64)
    logp = old + torch.log(torch.tensor(RATIOS, dtype=torch.float64))[None, :]
    params = LossParams(eps_low=EPS_LOW, eps_high=EPS_HIGH, ratio_level="token", dual_clip_c=dual,
                        log_ratio_clip=None)
    lp = logp.to(dtype).requires_grad_()
    out = hacpo_loss(lp, torch.ones_like(lp, dtype=torch.bool), torch.tensor(advantages, dtype=dtype), None,
                     torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=dtype), params, old_logp=old.to(dtype),
                     backend=backend)
    out.loss.backward()
    T = len(RATIOS)
    ref_obj = [sum(grpo_token_reference(w, a, dual)[0] for w in RATIOS) / T for a in advantages]
    # seq-mean-token-mean over 2 rows: loss = -(1/2) Σ_i (1/T) Σ_t obj; d loss / d logp = -(1/2)(1/T) d obj / d ell
    ref_grad = torch.tensor([[-grpo_token_reference(w, a, dual)[1] / (2 * T) for w in RATIOS] for a in advantages],
                            dtype=torch.float64)
    assert_sum_close(out.loss, -sum(ref_obj) / 2, 1.0, tol, f"loss [{backend}, c={dual}]")
    assert_rel_close(out.objectives, torch.tensor(ref_obj, dtype=torch.float64), tol, f"objectives [{backend}]")
    assert_rel_close(lp.grad, ref_grad, tol, f"grad [{backend}, c={dual}]")
    # the negative-advantage tokens with w > 3 pass gradient only without the dual clip
    cut = lp.grad[1, [RATIOS.index(3.5), RATIOS.index(6.0)]]
    assert bool((cut == 0).all()) == (dual is not None)


def k3_reference(d: float) -> tuple[float, float]:
    """(clamped k3, d k3 / d logp) of one token with d = ref - logp, plain float64 math."""
    dc = max(-20.0, min(20.0, d))
    k3 = math.exp(dc) - dc - 1.0
    inside = -20.0 <= d <= 20.0 and k3 <= 10.0
    return min(k3, 10.0), ((1.0 - math.exp(dc)) if inside else 0.0)


@pytest.mark.parametrize("backend,dtype,tol", BACKENDS)
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_kl_is_clamped_like_low_var_kl(backend, dtype, tol, agg):
    # d = ref - logp on 2 own rows: inside both clamps, k3 above 10 (d = 2.7: 11.2, d = -12: 11.0), beyond ±20
    d = torch.tensor([[-25.0, -12.0, -1.0, 0.5], [2.0, 2.7, 3.0, 30.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    logp = torch.full_like(d, -2.0)
    ref = logp + d
    beta = 0.5
    params = LossParams(kl_coef=beta, loss_agg=agg)
    lp = logp.to(dtype).requires_grad_()
    out = hacpo_loss(lp, mask, torch.zeros(2, dtype=dtype), torch.full((2,), -2.0, dtype=dtype),
                     torch.ones(2, dtype=torch.bool), torch.ones(2, dtype=dtype), params, ref_logp=ref.to(dtype),
                     backend=backend)
    out.loss.backward()
    k = [[k3_reference(float(x)) for x in row] for row in d]
    lengths = mask.sum(dim=1).tolist()
    if agg == "token-mean":
        n = sum(lengths)
        ref_kl = sum(k[i][t][0] for i in range(2) for t in range(4) if mask[i, t]) / n
        weight = [[1.0 / n] * 4] * 2
    else:
        ref_kl = sum(sum(k[i][t][0] for t in range(4) if mask[i, t]) / lengths[i] for i in range(2)) / 2
        weight = [[1.0 / (2 * lengths[i])] * 4 for i in range(2)]
    ref_grad = torch.tensor([[beta * weight[i][t] * k[i][t][1] if mask[i, t] else 0.0 for t in range(4)]
                             for i in range(2)], dtype=torch.float64)
    assert float(out.metrics["kl"]) == pytest.approx(ref_kl, rel=tol * 10)
    assert_sum_close(out.loss, beta * ref_kl, 1.0, tol, f"loss [{backend}, {agg}]")
    assert_rel_close(lp.grad, ref_grad, tol, f"grad [{backend}, {agg}]")
    assert float(lp.grad[1, 1]) == 0.0 and float(lp.grad[0, 1]) == 0.0  # k3 > 10: clamped, no gradient


def test_the_grpo_loss_has_the_dual_clip_and_gspo_has_not():
    # one own row, token ratio 5 with a negative advantage: GRPO's objective is c·A = -3, GSPO's is s·A = -5
    logp = torch.tensor([[math.log(5.0) - 1.0]], dtype=torch.float64, requires_grad=True)
    inp = dict(logp=logp, mask=torch.ones(1, 1), advantages=torch.tensor([-1.0], dtype=torch.float64),
               old_logp_mean=torch.tensor([-1.0], dtype=torch.float64), is_own=torch.tensor([True]),
               coef=torch.ones(1, dtype=torch.float64), old_logp=torch.tensor([[-1.0]], dtype=torch.float64))
    grpo = get_policy_loss("grpo")(PolicyLossInput(**inp), PolicyLossConfig.for_algorithm("grpo", kl_coef=0.0))
    assert float(grpo.objectives[0]) == pytest.approx(-3.0)
    gspo_cfg = PolicyLossConfig.for_algorithm("gspo", kl_coef=0.0, eps_low=0.2, eps_high=0.28, log_ratio_clip=None)
    gspo = get_policy_loss("gspo")(PolicyLossInput(**inp), gspo_cfg)
    assert float(gspo.objectives[0]) == pytest.approx(-5.0)
    off = get_policy_loss("grpo")(PolicyLossInput(**inp),
                                  PolicyLossConfig.for_algorithm("grpo", kl_coef=0.0, dual_clip_c=None))
    assert float(off.objectives[0]) == pytest.approx(-5.0)
