"""Policy losses: hand-computed values and gradients for gspo, hacpo, naive and grpo, every switch, the KL term,
the aggregation modes, the metrics, the registry and input errors."""
import math

import pytest
import torch

from hacpo_reference import reference_sequence_loss
from openrlhf_hacpo.algorithms import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossInput,
    LossTotals,
    PolicyLossOutput,
    get_policy_loss,
)

EXP = math.exp


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def make_input(logp, old_mean, adv, is_own, coef=None, mask=None, **extra):
    logp_t = f64(logp).requires_grad_(True)
    rows = len(logp)
    return PolicyLossInput(
        logp=logp_t,
        mask=f64(mask) if mask is not None else torch.ones_like(logp_t.detach()),
        advantages=f64(adv),
        old_logp_mean=f64(old_mean),
        is_own=torch.tensor(is_own),
        coef=f64(coef if coef is not None else [1.0] * rows),
        **extra,
    )


def cfg(**kw):
    kw.setdefault("kl_coef", 0.0)
    return PolicyLossConfig.of(**kw)


def loss_and_grad(name, inp, config):
    out = get_policy_loss(name)(inp, config)
    out.loss.backward()
    return out, inp.logp.grad


def test_gspo_by_hand():
    # row 0: mean logp −1.5, old −1.5002 ⇒ s = e^0.0002 inside [0.9997, 1.0004]: obj = s·A
    # row 1: s = e^0.001 > 1.0004, A = +1 ⇒ min picks the clipped 1.0004·A, no gradient
    # row 2: s = e^0.001, A = −2 ⇒ min picks s·A (more negative), gradient flows
    inp = make_input([[-1.0, -2.0], [-1.0, -1.0], [-0.5, -0.5]], [-1.5002, -1.001, -0.501], [0.5, 1.0, -2.0],
                     [True, True, True])
    out, grad = loss_and_grad("gspo", inp, cfg())
    s0, s1 = EXP(0.0002), EXP(0.001)
    objectives = [s0 * 0.5, 1.0004 * 1.0, s1 * -2.0]
    assert out.objectives.tolist() == pytest.approx(objectives, abs=1e-12)
    assert out.loss.item() == pytest.approx(-sum(objectives) / 3, abs=1e-12)
    # d loss / d logp_t = −(1/3)·(1/L)·s·A for active rows (∇s = s·(1/L)·Σ∇logp, Prop. D.5)
    expected = [[-s0 * 0.5 / 2 / 3] * 2, [0.0, 0.0], [s1 * 2.0 / 2 / 3] * 2]
    torch.testing.assert_close(grad, f64(expected), rtol=0, atol=1e-14)


def test_hacpo_foreign_rows_by_hand():
    # foreign rows, α = 1, ω = 2, m = 0 ⇒ window [0.8, 1]
    #  row 0: s = 0.9 ⇒ obj = 0.9·0.9·2·A, gradient s²·ω·A/L
    #  row 1: s = 1.2 > 1 ⇒ c = 1, obj = ω·A, no gradient (no min(): even for A < 0)
    #  row 2: s = 0.5 < 0.8 ⇒ c = 0.8, obj = 0.8·0.8·ω·A, no gradient
    logp = [[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]
    old = [-1.0 - math.log(0.9), -1.0 - math.log(1.2), -1.0 - math.log(0.5)]
    adv = [0.5, -1.5, 2.0]
    inp = make_input(logp, old, adv, [False] * 3, coef=[2.0] * 3)
    out, grad = loss_and_grad("hacpo", inp, cfg(alpha=1.0))
    objectives = [0.9 * 0.9 * 2 * 0.5, 1.0 * 2 * -1.5, 0.8 * 0.8 * 2 * 2.0]
    assert out.objectives.tolist() == pytest.approx(objectives, abs=1e-12)
    assert out.loss.item() == pytest.approx(-sum(objectives) / 3, abs=1e-12)
    expected = [[-(0.9 ** 2) * 2 * 0.5 / 2 / 3] * 2, [0.0, 0.0], [0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=0, atol=1e-14)
    assert out.metrics["foreign_clip_frac_lower"] == pytest.approx(1 / 3)
    assert out.metrics["foreign_clip_frac_upper"] == pytest.approx(1 / 3)
    assert out.metrics["foreign_in_window_frac"] == pytest.approx(1 / 3)
    assert out.metrics["cross_lower_bound"] == pytest.approx(0.8)
    assert out.metrics["foreign_ratio_mean"] == pytest.approx((0.9 + 1.2 + 0.5) / 3)
    assert out.metrics["num_foreign"] == 3.0 and out.metrics["num_own"] == 0.0
    # among the foreign rows with A > 0 (rows 0 and 2): one inside the window, one below it
    assert out.metrics["num_foreign_pos"] == 2.0
    assert out.metrics["foreign_pos_in_window_frac"] == pytest.approx(0.5)
    assert out.metrics["foreign_pos_clip_frac_lower"] == pytest.approx(0.5)
    assert out.metrics["foreign_pos_clip_frac_upper"] == 0.0
    assert out.ratios.tolist() == pytest.approx([0.9, 1.2, 0.5], abs=1e-12)


def foreign_row(s, adv=1.0, coef=2.0, **extra):
    return make_input([[-1.0]], [-1.0 - math.log(s)], [adv], [False], coef=[coef], **extra)


def test_hacpo_alpha_weights_and_switches():
    # α = 3: obj = s·s³·ω·A
    out, grad = loss_and_grad("hacpo", foreign_row(0.9), cfg(alpha=3.0))
    assert out.objectives.item() == pytest.approx(0.9 ** 4 * 2.0)
    assert grad.item() == pytest.approx(-(0.9 ** 4) * 2.0)
    # capability_coef=False: ω treated as 1 (the "HACPO − ω" ablation)
    out = get_policy_loss("hacpo")(foreign_row(0.9), cfg(capability_coef=False))
    assert out.objectives.item() == pytest.approx(0.9 ** 2)
    # cross_clip=False: c = s, so s = 1.3 keeps its weight and its gradient (the "no Clip" ablation)
    out, grad = loss_and_grad("hacpo", foreign_row(1.3), cfg(cross_clip=False))
    assert out.objectives.item() == pytest.approx(1.3 ** 2 * 2.0)
    assert grad.item() == pytest.approx(-(1.3 ** 2) * 2.0)


def test_cross_clip_high_widens_the_window_above_one():
    # window [0.8, 1.25]: s = 1.2 is inside (weight 1.2^α, gradient s^(α+1)·ω·A), s = 1.3 is clamped to 1.25
    out, grad = loss_and_grad("hacpo", foreign_row(1.2, adv=-0.5), cfg(cross_clip_high=1.25))
    assert out.objectives.item() == pytest.approx(1.2 ** 2 * 2.0 * -0.5)
    assert grad.item() == pytest.approx(1.2 ** 2 * 2.0 * 0.5)
    assert out.metrics["foreign_in_window_frac"] == 1.0 and out.metrics["foreign_clip_frac_upper"] == 0.0
    out, grad = loss_and_grad("hacpo", foreign_row(1.3), cfg(cross_clip_high=1.25))
    assert out.objectives.item() == pytest.approx(1.25 ** 2 * 2.0)
    assert grad.item() == 0.0
    assert out.metrics["foreign_clip_frac_upper"] == 1.0
    # the default keeps the paper's upper end 1: s = 1.2 gets no gradient
    _, grad = loss_and_grad("hacpo", foreign_row(1.2), cfg())
    assert grad.item() == 0.0
    with pytest.raises(ValueError, match="cross_clip_high"):
        cfg(cross_clip_high=0.95)


def test_pessimistic_foreign_rule_by_hand():
    # min(s·A, c·A)·sg(c)^α·ω with window [0.8, 1], α = 1, ω = 2
    pessimistic = cfg(cross_clip_mode="pessimistic")
    # A > 0 below the window: s·A < c·A, so the row keeps the gradient, weighted by sg(c) = 0.8
    out, grad = loss_and_grad("hacpo", foreign_row(0.5, adv=1.0), pessimistic)
    assert out.objectives.item() == pytest.approx(0.5 * 0.8 * 2.0)
    assert grad.item() == pytest.approx(-0.5 * 0.8 * 2.0)
    # A < 0 above the window: s·A < c·A, gradient kept, weight sg(c) = 1
    out, grad = loss_and_grad("hacpo", foreign_row(1.3, adv=-1.0), pessimistic)
    assert out.objectives.item() == pytest.approx(-1.3 * 2.0)
    assert grad.item() == pytest.approx(1.3 * 2.0)
    # A > 0 above and A < 0 below the window: the clipped branch wins, no gradient
    for s, adv in ((1.3, 1.0), (0.5, -1.0)):
        out, grad = loss_and_grad("hacpo", foreign_row(s, adv=adv), pessimistic)
        c = min(max(s, 0.8), 1.0)
        assert out.objectives.item() == pytest.approx(c * c * 2.0 * adv)
        assert grad.item() == 0.0
    # dual clip: A < 0 and s = 4 > dual = 3 gives dual·A·sg(c)·ω with no gradient; s = 2.5 < 3 keeps it
    out, grad = loss_and_grad("hacpo", foreign_row(4.0, adv=-1.0), pessimistic)
    assert out.objectives.item() == pytest.approx(3.0 * -1.0 * 1.0 * 2.0)
    assert grad.item() == 0.0
    out, grad = loss_and_grad("hacpo", foreign_row(2.5, adv=-1.0), cfg(cross_clip_mode="pessimistic",
                                                                       cross_clip_dual=2.0))
    assert out.objectives.item() == pytest.approx(2.0 * -1.0 * 2.0) and grad.item() == 0.0
    with pytest.raises(ValueError, match="cross_clip_dual"):
        cfg(cross_clip_mode="pessimistic", cross_clip_high=1.5, cross_clip_dual=1.2)
    # inside the window both rules agree
    for mode in ("clamp", "pessimistic"):
        out, grad = loss_and_grad("hacpo", foreign_row(0.9, adv=-1.0), cfg(cross_clip_mode=mode))
        assert grad.item() == pytest.approx(0.9 * 0.9 * 2.0)
    with pytest.raises(ValueError, match="cross_clip_mode"):
        cfg(cross_clip_mode="min")


def test_stepwise_lower_bound():
    # m = 3 ⇒ lo = 0.8 + 3·0.025 = 0.875: s = 0.86 is now outside the window
    out, grad = loss_and_grad("hacpo", foreign_row(0.86, update_index=3), cfg())
    assert out.objectives.item() == pytest.approx(0.875 ** 2 * 2.0)
    assert grad.item() == 0.0
    assert out.metrics["cross_lower_bound"] == pytest.approx(0.875)
    # stepwise=False: the bound stays at 1 − δ = 0.8 and s = 0.86 is inside
    out, grad = loss_and_grad("hacpo", foreign_row(0.86, update_index=3), cfg(stepwise=False))
    assert out.objectives.item() == pytest.approx(0.86 ** 2 * 2.0)
    assert grad.item() == pytest.approx(-(0.86 ** 2) * 2.0)
    # the bound is capped at 1: m = 9 gives min(1, 1.025) = 1
    assert cfg().cross_lower_bound(9) == 1.0
    assert [cfg().cross_lower_bound(m) for m in range(4)] == pytest.approx([0.8, 0.825, 0.85, 0.875])


def test_naive_uses_self_clip_everywhere_and_ignores_coef():
    # a foreign row with s = 0.9 and A > 0: self clip ⇒ min(0.9·A, 0.9997·A) = 0.9·A, coef ignored
    out, grad = loss_and_grad("naive", foreign_row(0.9, adv=1.0, coef=5.0), cfg())
    assert out.objectives.item() == pytest.approx(0.9)
    assert grad.item() == pytest.approx(-0.9)
    # with A < 0: min(0.9·A, 0.9997·A) = 0.9997·A, clipped, no gradient
    out, grad = loss_and_grad("naive", foreign_row(0.9, adv=-1.0, coef=5.0), cfg())
    assert out.objectives.item() == pytest.approx(-0.9997)
    assert grad.item() == 0.0


def test_grpo_token_ratios_by_hand():
    config = PolicyLossConfig.for_algorithm("grpo", kl_coef=0.0)
    assert (config.params.eps_low, config.params.eps_high) == (0.2, 0.28)
    logp = [[-1.0, -2.0]]
    old = [[-1.0 - math.log(1.5), -2.0 - math.log(0.9)]]  # w = [1.5, 0.9]
    inp = make_input(logp, [0.0], [1.0], [True], old_logp=f64(old))
    out, grad = loss_and_grad("grpo", inp, config)
    # token 0: min(1.5, 1.28) = 1.28 (clipped, no gradient); token 1: min(0.9, 0.9) = 0.9
    assert out.objectives.item() == pytest.approx((1.28 + 0.9) / 2)
    torch.testing.assert_close(grad, f64([[0.0, -0.9 / 2]]), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="needs PolicyLossInput.old_logp"):
        get_policy_loss("grpo")(make_input(logp, [0.0], [1.0], [True]), config)


def test_token_level_hacpo_with_aligned_old_logp():
    # per-token ratios [0.9, 0.7] on a foreign row: token 1 is below the window [0.8, 1]
    old = [[-1.0 - math.log(0.9), -1.0 - math.log(0.7)]]
    inp = make_input([[-1.0, -1.0]], [0.0], [1.0], [False], coef=[2.0], old_logp=f64(old))
    out, grad = loss_and_grad("hacpo", inp, cfg(ratio_level="token"))
    assert out.objectives.item() == pytest.approx((0.81 * 2 + 0.64 * 2) / 2)
    torch.testing.assert_close(grad, f64([[-0.81 * 2 / 2, 0.0]]), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="foreign rows only carry the source's sequence mean"):
        get_policy_loss("hacpo")(foreign_row(0.9), cfg(ratio_level="token"))


def test_log_ratio_clamp_modes():
    # mean log-ratio −15 with A = 1 (min picks s·A): symmetric clamp to −10 (v1 code), upper-only clamp leaves
    # −15 (main code)
    inp = make_input([[-16.0]], [-1.0], [1.0], [True])
    sym, grad = loss_and_grad("gspo", inp, cfg(log_ratio_clip=10.0))
    assert sym.objectives.item() == pytest.approx(EXP(-10.0), rel=1e-12)
    assert grad.item() == 0.0  # the clamp is active
    upper, grad = loss_and_grad("gspo", make_input([[-16.0]], [-1.0], [1.0], [True]),
                                cfg(log_ratio_clip=10.0, log_ratio_clip_mode="upper"))
    assert upper.objectives.item() == pytest.approx(EXP(-15.0), rel=1e-12)
    assert grad.item() == pytest.approx(-EXP(-15.0), rel=1e-12)
    none = get_policy_loss("gspo")(make_input([[-16.0]], [-1.0], [1.0], [True]), cfg(log_ratio_clip=None))
    assert none.objectives.item() == pytest.approx(EXP(-15.0), rel=1e-12)
    # an upper clamp of +10 applies in both modes
    big = get_policy_loss("gspo")(make_input([[14.0]], [1.0], [-1.0], [True]),
                                  cfg(log_ratio_clip=10.0, log_ratio_clip_mode="upper"))
    assert big.objectives.item() == pytest.approx(-EXP(10.0), rel=1e-12)


def k3(logp, ref):
    d = ref - logp
    return EXP(d) - d - 1


def test_low_var_kl_on_own_rows_only():
    logp = [[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5]]
    mask = [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    ref = [[-1.2, -1.5, 0.0], [-1.0, -0.8, -1.3], [-3.0, 0.0, 0.0]]
    # rows 0 and 1 are own at s = 1 (A = 0 ⇒ zero policy objective); row 2 is foreign and must not count
    inp = make_input(logp, [-1.5, -1.0, -0.5], [0.0, 0.0, 0.0], [True, True, False], mask=mask, ref_logp=f64(ref))
    out, grad = loss_and_grad("hacpo", inp, cfg(kl_coef=0.5))
    row0 = (k3(-1.0, -1.2) + k3(-2.0, -1.5)) / 2
    row1 = (k3(-1.0, -1.0) + k3(-1.0, -0.8) + k3(-1.0, -1.3)) / 3
    kl = (row0 + row1) / 2  # seq-mean-token-mean over the 2 own rows
    assert out.metrics["kl"] == pytest.approx(kl, abs=1e-12)
    assert out.loss.item() == pytest.approx(0.5 * kl, abs=1e-12)
    # d k3 / d logp = 1 − exp(ref − logp)
    expected_row0 = [0.5 * (1 - EXP(-0.2)) / 2 / 2, 0.5 * (1 - EXP(0.5)) / 2 / 2, 0.0]
    assert grad[0].tolist() == pytest.approx(expected_row0, abs=1e-12)
    assert grad[2].tolist() == [0.0, 0.0, 0.0]
    # token-mean: 5 own tokens weighted equally
    inp = make_input(logp, [-1.5, -1.0, -0.5], [0.0, 0.0, 0.0], [True, True, False], mask=mask, ref_logp=f64(ref))
    out = get_policy_loss("hacpo")(inp, cfg(kl_coef=0.5, loss_agg="token-mean"))
    assert out.metrics["kl"] == pytest.approx((row0 * 2 + row1 * 3) / 5, abs=1e-12)
    with pytest.raises(ValueError, match="needs PolicyLossInput.ref_logp"):
        get_policy_loss("gspo")(make_input([[-1.0]], [-1.0], [1.0], [True]), PolicyLossConfig())


def test_token_mean_aggregation_by_hand():
    # rows of 1 and 3 tokens, both inside the clip: objectives s·A weighted by token count
    inp = make_input([[-1.0, 0.0, 0.0], [-2.0, -2.0, -2.0]], [-1.0, -2.0], [1.0, -0.5], [True, True],
                     mask=[[1, 0, 0], [1, 1, 1]])
    out = get_policy_loss("gspo")(inp, cfg(loss_agg="token-mean"))
    assert out.loss.item() == pytest.approx(-(1 * 1.0 + 3 * -0.5) / 4)
    seq = get_policy_loss("gspo")(inp, cfg())
    assert seq.loss.item() == pytest.approx(-(1.0 - 0.5) / 2)


def test_denominators_from_the_mini_batch():
    inp = make_input([[-1.0]], [-1.0], [2.0], [True], totals=LossTotals(num_seqs=4, num_tokens=10))
    assert get_policy_loss("gspo")(inp, cfg()).loss.item() == pytest.approx(-2.0 / 4)
    assert get_policy_loss("gspo")(inp, cfg(loss_agg="token-mean")).loss.item() == pytest.approx(-2.0 / 10)


def test_own_metrics():
    # ratios 0.99 (below 0.9997), 1.0, 1.01 (above 1.0004)
    inp = make_input([[0.0]] * 3, [-math.log(0.99), 0.0, -math.log(1.01)], [1.0, 1.0, 1.0], [True] * 3)
    out = get_policy_loss("gspo")(inp, cfg())
    m = out.metrics
    assert m["own_clip_frac_lower"] == pytest.approx(1 / 3) and m["own_clip_frac_upper"] == pytest.approx(1 / 3)
    assert m["own_ratio_mean"] == pytest.approx(1.0, abs=1e-12)
    assert m["num_own"] == 3.0
    assert all(isinstance(v, float) for v in m.values())
    assert isinstance(out, PolicyLossOutput) and not out.objectives.requires_grad


def test_matches_reference_on_a_mixed_batch():
    gen = torch.Generator().manual_seed(3)
    logp = (-torch.rand(6, 4, generator=gen, dtype=torch.float64) * 2).tolist()
    mask = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    means = [sum(v for v, k in zip(r, mk) if k) / sum(mk) for r, mk in zip(logp, mask)]
    ratios = [1.0001, 0.95, 0.85, 0.7, 1.05, 0.99]
    old = [m - math.log(s) for m, s in zip(means, ratios)]
    adv, own, coef = [0.3, -1.2, 0.8, 1.5, -0.4, 2.0], [True, False, False, False, False, True], \
        [1.0, 3.0, 0.5, 2.0, 1.5, 1.0]
    cases = (("hacpo", "cross", 1.0, "clamp", 3.0), ("naive", "self_clip", 1.0, "clamp", 3.0),
             ("hacpo", "cross", 1.1, "clamp", 3.0), ("hacpo", "cross", 1.0, "pessimistic", 3.0),
             ("hacpo", "cross", 1.0, "pessimistic", 1.02))  # the last cuts row 4 (s = 1.05, A < 0)
    for name, rule, high, mode, dual in cases:
        inp = make_input(logp, old, adv, own, coef=coef, mask=mask, update_index=1)
        out, grad = loss_and_grad(name, inp, cfg(alpha=2.0, cross_clip_high=high, cross_clip_mode=mode,
                                                 cross_clip_dual=dual))
        loss, objectives, ref_grad = reference_sequence_loss(logp, mask, adv, old, own, coef, m=1, alpha=2.0,
                                                            foreign_rule=rule, cross_clip_high=high,
                                                            cross_clip_mode=mode, cross_clip_dual=dual)
        assert out.loss.item() == pytest.approx(loss, abs=1e-12)
        assert out.objectives.tolist() == pytest.approx(objectives, abs=1e-12)
        torch.testing.assert_close(grad, f64(ref_grad), rtol=0, atol=1e-12)


def test_registry_is_the_table_of_four_rows():
    assert set(POLICY_LOSSES) == {"grpo", "gspo", "hacpo", "naive"}
    with pytest.raises(KeyError, match=r"unknown policy loss 'ppo'; known: \[.*'gspo'.*'hacpo'"):
        get_policy_loss("ppo")
    config = PolicyLossConfig.of(kl_coef=0.0, ratio_level="token")
    rows = {name: (loss.params(config).ratio_level, loss.params(config).foreign_rule, loss.params(config).dual_clip_c)
            for name, loss in POLICY_LOSSES.items()}
    assert rows == {"grpo": ("token", "cross", 3.0), "gspo": ("token", "cross", None),
                    "hacpo": ("token", "cross", None), "naive": ("token", "self_clip", None)}
    assert get_policy_loss("hacpo").params(PolicyLossConfig(), 2).lo == pytest.approx(0.85)


def test_single_agent_losses_reject_foreign_rows():
    for name in ("gspo", "grpo"):
        inp = make_input([[-1.0], [-1.0]], [-1.0, -1.0], [1.0, 1.0], [True, False], old_logp=f64([[-1.0], [-1.0]]))
        with pytest.raises(ValueError, match=f"policy loss '{name}' trains on the learner's own rollouts only"):
            get_policy_loss(name)(inp, PolicyLossConfig.for_algorithm(name, kl_coef=0.0))


def good_fields():
    return dict(logp=torch.zeros(2, 3, dtype=torch.float64), mask=torch.ones(2, 3), advantages=f64([1.0, -1.0]),
                old_logp_mean=f64([0.0, 0.0]), is_own=torch.tensor([True, False]), coef=f64([1.0, 2.0]))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(logp=torch.zeros(2, 3, 1)), r"logp must be a \[B, T\] tensor"),
        (dict(logp=torch.zeros(0, 3)), "logp is empty"),
        (dict(logp=torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])), "logp contains NaN"),
        (dict(mask=torch.ones(2, 4)), r"mask must have shape \[2, 3\]"),
        (dict(mask=torch.tensor([[1, 1, 1], [0, 0, 0]])), "mask row 1 has no response tokens"),
        (dict(advantages=f64([1.0])), r"advantages must have shape \[2\]"),
        (dict(advantages=f64([1.0, float("inf")])), "advantages contains NaN or inf"),
        (dict(old_logp_mean=f64([0.0, float("nan")])), "old_logp_mean contains NaN"),
        (dict(coef=f64([1.0, 0.0])), "coef must be > 0"),
        (dict(coef=f64([1.0, -3.0])), "coef must be > 0"),
        (dict(is_own=torch.tensor([1, 0])), "is_own must be a bool tensor"),
        (dict(ref_logp=torch.zeros(2, 2)), r"ref_logp must have shape \[2, 3\]"),
        (dict(totals=LossTotals(num_seqs=1)), r"num_seqs must be >= 2"),
        (dict(totals=LossTotals(num_tokens=5)), r"num_tokens must be >= 6"),
        (dict(update_index=-1), "update_index must be an int >= 0"),
    ],
)
def test_bad_loss_inputs(change, match):
    fields = good_fields()
    fields.update(change)
    with pytest.raises(ValueError, match=match):
        get_policy_loss("hacpo")(PolicyLossInput(**fields), cfg())


def test_masked_padding_may_hold_non_finite_values():
    # padding positions are ignored even if they hold −inf
    fields = good_fields()
    fields["logp"] = torch.tensor([[-1.0, float("-inf"), 0.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    fields["mask"] = torch.tensor([[1, 0, 1], [1, 1, 1]])
    out = get_policy_loss("hacpo")(PolicyLossInput(**fields), cfg())
    assert math.isfinite(out.loss.item())
