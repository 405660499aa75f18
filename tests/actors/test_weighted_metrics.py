"""Weighted metric means and their merge over ranks; the loss metrics' weights by key prefix (hand-computed)."""
from __future__ import annotations

import math

import pytest

from openrlhf_hacpo.actors.learner_metrics import record_loss_metrics
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted


def test_merge_is_the_weighted_mean_over_all_ranks_values():
    """Rank 0: x = 1 (w 1), 4 (w 3); rank 1: x = 10 (w 4). Merged: (1 + 12 + 40) / 8 = 6.625, not the mean of the
    ranks' means (3.25 and 10)."""
    a, b = WeightedMeans(), WeightedMeans()
    a.add("x", 1.0, 1.0)
    a.add("x", 4.0, 3.0)
    b.add("x", 10.0, 4.0)
    b.add("y", 2.0)
    merged = merge_weighted([a.state(), b.state()])
    assert merged == {"x": pytest.approx(53.0 / 8.0), "y": 2.0}


def test_non_finite_values_and_empty_weights_are_left_out():
    stats = WeightedMeans()
    stats.add("x", math.nan, 1.0)
    stats.add("x", math.inf, 1.0)
    stats.add("x", 5.0, 0.0)
    stats.add("x", 3.0, 2.0)
    stats.add("z", 7.0, 0.0)
    assert merge_weighted([stats.state()]) == {"x": 3.0}


def test_loss_metrics_merged_over_micro_batches_equal_the_whole_batchs():
    """Rows split 3 + 5 into two loss calls: every recorded metric, merged with the weights the loss declares, equals
    the metric of one call over all 8 rows (clip fractions, ratio means, window fractions, objective mean); counts,
    the loss and its two terms are not recorded."""
    import torch

    from openrlhf_hacpo.algorithms import PolicyLossConfig, PolicyLossInput, get_policy_loss

    log_s = torch.tensor([-0.3, 0.0, 0.2, -0.1, -0.25, 0.05, -0.5, 0.0004], dtype=torch.float64)
    fields = dict(logp=log_s[:, None].repeat(1, 2), mask=torch.ones(8, 2), old_logp_mean=torch.zeros(8,
                  dtype=torch.float64), advantages=torch.tensor([1.0, -1.0, 2.0, 1.0, 0.5, -2.0, 1.0, 1.0],
                  dtype=torch.float64), is_own=torch.tensor([True, False, True, False, False, True, False, True]),
                  coef=torch.full((8,), 0.5, dtype=torch.float64))
    cfg = PolicyLossConfig.of(kl_coef=0.0)
    loss = get_policy_loss("hacpo")
    whole = loss(PolicyLossInput(**fields), cfg)
    stats = WeightedMeans()
    for part in (slice(0, 3), slice(3, 8)):
        record_loss_metrics(loss(PolicyLossInput(**{k: v[part] for k, v in fields.items()}), cfg), stats)
    merged = merge_weighted([stats.state()])
    assert {k.removeprefix("policy/") for k in merged} == set(whole.weights)
    for key, value in merged.items():
        assert value == pytest.approx(whole.metrics[key.removeprefix("policy/")], abs=1e-12), key
    assert not {"policy/loss", "policy/num_own", "policy/pg_loss", "policy/kl"} & set(merged)
    # by hand: foreign rows s = 1.0, 0.905, 0.779, 0.607 -> inside [0.8, 1]: 1.0 and 0.905, so half of them
    assert merged["policy/foreign_in_window_frac"] == pytest.approx(0.5)
