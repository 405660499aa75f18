"""Metrics against hand values, enumeration in float64, verl's bootstrap written out, and the closed form."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from openrlhf_hacpo.reproduce.metrics import (
    ScoredSample,
    aggregate_by_data_source,
    best_at_k_bootstrap,
    best_at_k_expected,
    mean_at_k,
    pass_at_k,
)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (4, 1, 1, 1 - 3 / 4),
        (10, 3, 4, 1 - 35 / 210),  # C(7,4) = 35, C(10,4) = 210
        (30, 1, 30, 1.0),  # any correct sample among all 30
        (30, 0, 30, 0.0),
        (30, 30, 1, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k must be in"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(4, 5, 1)


def _enumerated_expected_max(values: list[float], k: int) -> float:
    """Mean of max over all n^k ordered draws with replacement (float64, exact for small n, k)."""
    draws = list(itertools.product(values, repeat=k))
    return float(np.mean([max(d) for d in draws]))


@pytest.mark.parametrize("values,k", [([0.0, 0.5, 1.0], 2), ([1.0, 0.0, 0.0, 1.0], 3), ([0.2, 0.7], 4), ([1.0], 3)])
def test_expected_best_at_k_equals_enumeration(values: list[float], k: int) -> None:
    assert best_at_k_expected(values, k) == pytest.approx(_enumerated_expected_max(values, k), abs=1e-12)


def test_expected_best_at_k_hand_values() -> None:
    assert best_at_k_expected([0.0, 0.5, 1.0], 2) == pytest.approx(6.5 / 9, abs=1e-12)
    # binary rewards: 1 - (1 - c/n)^k
    assert best_at_k_expected([1.0] + [0.0] * 29, 30) == pytest.approx(1 - (29 / 30) ** 30, abs=1e-12)
    assert 1 - (29 / 30) ** 30 == pytest.approx(0.6383, abs=1e-4)


def test_paper_aime_values_are_the_expected_best_at_30() -> None:
    """0.021 = one AIME prompt with 1 of 30 correct; 0.054 = prompts with 4 and 1 correct (30 prompts)."""
    def aime(correct_counts: list[int]) -> float:
        samples = [
            ScoredSample("aime25", f"p{p}", float(i < (correct_counts[p] if p < len(correct_counts) else 0)))
            for p in range(30) for i in range(30)
        ]
        return aggregate_by_data_source(samples)["aime25"].best_at_k_expected

    assert round(aime([1]), 3) == 0.021
    assert round(aime([4, 1]), 3) == 0.054


def _verl_bootstrap_written_out(values: list[float], k: int) -> float:
    """verl's loop: global numpy seed 42, 1000 times choice(n, k, replace=True), mean of the maxima."""
    saved = np.random.get_state()
    try:
        np.random.seed(42)
        maxima = []
        for _ in range(1000):
            idx = np.random.choice(len(values), size=k, replace=True)
            maxima.append(np.max([values[i] for i in idx]))
        return float(np.mean(maxima))
    finally:
        np.random.set_state(saved)


@pytest.mark.parametrize("c", [0, 1, 4, 15, 30])
def test_bootstrap_matches_verl_and_the_closed_form(c: int) -> None:
    values = [1.0] * c + [0.0] * (30 - c)
    boot = best_at_k_bootstrap(values, 30)
    assert boot == pytest.approx(_verl_bootstrap_written_out(values, 30), abs=1e-15)
    closed = 1 - (1 - c / 30) ** 30
    # standard error of a mean of 1000 maxima is at most 0.5 / sqrt(1000) = 0.0158
    assert abs(boot - closed) < 4 * 0.5 / math.sqrt(1000)
    if c in (0, 30):
        assert boot == closed


def test_bootstrap_draws_do_not_depend_on_global_numpy_state() -> None:
    values = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    np.random.seed(7)
    first = best_at_k_bootstrap(values, 6)
    np.random.seed(8)
    assert best_at_k_bootstrap(values, 6) == first
    assert best_at_k_bootstrap(values, 4) == pytest.approx(_verl_bootstrap_written_out(values, 4), abs=1e-15)


def test_aggregation_per_data_source() -> None:
    samples = [
        {"data_source": "math500", "prompt_id": "math500:0", "reward": 1.0},
        {"data_source": "aime25", "prompt_id": "aime25:0", "reward": 1.0},
        {"data_source": "math500", "prompt_id": "math500:1", "reward": 0.0},
        {"data_source": "math500", "prompt_id": "math500:2", "reward": 1.0},
    ]
    samples += [{"data_source": "aime25", "prompt_id": "aime25:0", "reward": 0.0}] * 3
    samples += [{"data_source": "aime25", "prompt_id": "aime25:1", "reward": 0.0}] * 4
    out = aggregate_by_data_source(samples)
    assert list(out) == ["math500", "aime25"]
    m = out["math500"]
    assert (m.num_prompts, m.num_samples, m.k) == (3, 1, 1)
    assert m.mean_at_n == pytest.approx(2 / 3, abs=1e-12)
    assert m.best_at_k is None and m.pass_at_k is None
    assert m.named() == {"mean@1": pytest.approx(2 / 3)}
    a = out["aime25"]
    assert (a.num_prompts, a.num_samples, a.k) == (2, 4, 4)
    assert a.mean_at_n == pytest.approx((0.25 + 0.0) / 2, abs=1e-12)
    assert a.pass_at_k == pytest.approx((1.0 + 0.0) / 2, abs=1e-12)
    assert a.best_at_k_expected == pytest.approx((1 - 0.75**4) / 2, abs=1e-12)
    assert set(a.named()) == {"mean@4", "best@4", "best@4/expected", "pass@4"}


def test_aggregation_errors_name_the_fault() -> None:
    uneven = [ScoredSample("gsm8k", "gsm8k:0", 1.0), ScoredSample("gsm8k", "gsm8k:0", 0.0),
              ScoredSample("gsm8k", "gsm8k:1", 1.0)]
    with pytest.raises(ValueError, match="'gsm8k'.*different sample counts"):
        aggregate_by_data_source(uneven)
    with pytest.raises(ValueError, match="sample 0 has no 'reward'"):
        aggregate_by_data_source([{"data_source": "a", "prompt_id": "a:0"}])
    with pytest.raises(ValueError, match="non-finite"):
        aggregate_by_data_source([ScoredSample("a", "a:0", float("nan"))])
    with pytest.raises(ValueError, match=r"k must be in \[1, 1\]"):
        aggregate_by_data_source([ScoredSample("a", "a:0", 1.0)], k=2)


def test_mean_at_k() -> None:
    assert mean_at_k([1, 0, 0, 1]) == 0.5
    with pytest.raises(ValueError):
        mean_at_k([])
