"""The paired-comparison statistics against published table values and hand-computed cases."""
import itertools
import math

import pytest

from openrlhf_hacpo.zoo.evidence import curve_auc, holm, paired_summary, sign_flip_p


def test_sign_flip_p_by_enumeration_and_its_floor():
    assert sign_flip_p([0.1] * 5) == pytest.approx(2 / 32)  # the smallest two-sided p at n = 5
    assert sign_flip_p([0.1] * 10) == pytest.approx(2 / 1024)
    d = [0.03, -0.01, 0.05, 0.02, -0.04, 0.06]
    count = sum(abs(sum(s * x for s, x in zip(signs, d))) >= abs(sum(d)) - 1e-15
                for signs in itertools.product((1, -1), repeat=len(d)))
    assert sign_flip_p(d) == pytest.approx(count / 64)
    assert sign_flip_p([]) is None


def test_paired_summary_by_hand():
    d = [0.1, 0.2, 0.3]
    out = paired_summary(d)
    std = math.sqrt(((0.1 - 0.2) ** 2 + 0 + (0.3 - 0.2) ** 2) / 2)  # 0.1
    half = 4.302653 * std / math.sqrt(3)  # t_{0.975, 2}
    assert out["mean"] == pytest.approx(0.2) and out["std"] == pytest.approx(std)
    assert (out["ci_low"], out["ci_high"]) == (pytest.approx(0.2 - half, abs=1e-6), pytest.approx(0.2 + half, abs=1e-6))
    assert out["p_sign_flip"] == pytest.approx(2 / 8) and out["positive"] == 3 and out["n"] == 3


def test_holm_step_down_by_hand():
    # sorted 0.01, 0.02, 0.04, 0.30: x4 = 0.04, x3 = 0.06, x2 = 0.08, x1 = 0.30; monotone
    adjusted = holm({"a": 0.04, "b": 0.01, "c": 0.30, "d": 0.02})
    assert adjusted == pytest.approx({"b": 0.04, "d": 0.06, "a": 0.08, "c": 0.30})
    # a later raw value below an earlier adjusted one keeps the earlier (monotone), capped at 1
    assert holm({"x": 0.3, "y": 0.31}) == pytest.approx({"x": 0.6, "y": 0.6})
    assert holm({"x": 0.9, "y": 0.8}) == pytest.approx({"y": 1.0, "x": 1.0})


def test_curve_auc_is_the_mean_accuracy_over_training():
    assert curve_auc([(0, 0.2), (10, 0.4), (20, 0.4)]) == pytest.approx((10 * 0.3 + 10 * 0.4) / 20)
    assert curve_auc([(20, 0.4), (0, 0.2), (10, 0.4)]) == pytest.approx(0.35)  # order does not matter
    assert curve_auc([(5, 0.5)]) == 0.5 and curve_auc([]) is None
