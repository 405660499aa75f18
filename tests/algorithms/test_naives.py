"""The two readings of the paper's Naive baseline, by hand: ``naive-paper`` (foreign rows as s·A, no window, no ω,
no α) and ``naive-gated`` (GSPO's own-row clip on foreign rows too), values and gradients in float64."""
import math

import pytest
import torch

from openrlhf_hacpo.algorithms import HACPOConfig, PolicyLossInput, get_policy_loss

EXP = math.exp


def _input(logp, old_mean, adv, is_own, coef):
    logp_t = torch.tensor(logp, dtype=torch.float64).requires_grad_(True)
    return PolicyLossInput(logp=logp_t, mask=torch.ones_like(logp_t.detach()),
                           advantages=torch.tensor(adv, dtype=torch.float64),
                           old_logp_mean=torch.tensor(old_mean, dtype=torch.float64),
                           is_own=torch.tensor(is_own), coef=torch.tensor(coef, dtype=torch.float64))


# rows: own inside GSPO's range; foreign success with s = e^-0.5 (below HACPO's window [0.8, 1]); foreign failure with
# s = e^-0.5; foreign success with s = e^0.3 (above the window); ω = 4 on every foreign row (must not act)
LOGP = [[-1.0, -1.0], [-2.0, -2.0], [-2.0, -2.0], [-1.0, -1.0]]
OLD = [-1.0001, -1.5, -1.5, -1.3]
ADV = [0.5, 1.0, -1.0, 2.0]
OWN = [True, False, False, False]
COEF = [1.0, 4.0, 4.0, 4.0]


def _run(preset):
    cfg = HACPOConfig.preset(preset)
    loss_cfg = cfg.loss.replaced({"kl_coef": 0.0})
    inp = _input(LOGP, OLD, ADV, OWN, COEF)
    out = get_policy_loss(cfg.loss_name)(inp, loss_cfg)
    out.loss.backward()
    return out, inp.logp.grad


def test_naive_paper_is_the_plain_importance_weighted_objective_on_foreign_rows():
    out, grad = _run("naive-paper")
    s = [EXP(0.0001), EXP(-0.5), EXP(-0.5), EXP(0.3)]
    objectives = [s[0] * 0.5, s[1] * 1.0, s[2] * -1.0, s[3] * 2.0]  # no clamp, no ω, no sg(c)^α
    assert out.objectives.tolist() == pytest.approx(objectives, abs=1e-12)
    assert out.loss.item() == pytest.approx(-sum(objectives) / 4, abs=1e-12)
    # d loss / d logp_t = -(1/4) · s · A / T on every row (T = 2 tokens): every row keeps its gradient
    expected = [[-(si * a) / 4 / 2] * 2 for si, a in zip(s, ADV)]
    assert grad.flatten().tolist() == pytest.approx([g for row in expected for g in row], abs=1e-12)


def test_naive_gated_keeps_successes_below_one_and_drops_failures():
    out, grad = _run("naive-gated")
    s = [EXP(0.0001), EXP(-0.5), EXP(-0.5), EXP(0.3)]
    lo, hi = 1 - 3e-4, 1 + 4e-4
    # min(s·A, clip(s)·A): success below the range keeps s·A (gradient); failure below it takes lo·A (none);
    # success above it takes hi·A (none)
    objectives = [s[0] * 0.5, s[1] * 1.0, lo * -1.0, hi * 2.0]
    assert out.objectives.tolist() == pytest.approx(objectives, abs=1e-12)
    expected = [[-(s[0] * 0.5) / 4 / 2] * 2, [-(s[1] * 1.0) / 4 / 2] * 2, [0.0, 0.0], [0.0, 0.0]]
    assert grad.flatten().tolist() == pytest.approx([g for row in expected for g in row], abs=1e-12)


def test_the_step_records_split_foreign_rows_by_the_sign_of_their_advantage():
    out, _ = _run("hacpo")  # window [0.8, 1] at update 0
    m = out.metrics
    # foreign A > 0: s = e^-0.5 (below), e^0.3 (above); A < 0: e^-0.5 (below)
    assert m["foreign_pos_clip_frac_lower"] == pytest.approx(0.5) and m["foreign_pos_clip_frac_upper"] == 0.5
    assert m["foreign_neg_clip_frac_lower"] == pytest.approx(1.0) and m["foreign_neg_in_window_frac"] == 0.0
    assert out.weights["foreign_neg_clip_frac_lower"] == 1.0 and out.weights["foreign_pos_in_window_frac"] == 2.0
    assert m["update0/foreign_neg_clip_frac_lower"] == m["foreign_neg_clip_frac_lower"]
    assert m["update0/own_clip_frac_lower"] == 0.0
