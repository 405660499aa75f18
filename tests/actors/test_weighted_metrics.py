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


def test_loss_metrics_are_weighted_by_the_rows_they_average_over():
    """Micro-batch 1: 3 own, 1 foreign (1 positive); micro-batch 2: 1 own, 3 foreign (2 positive).
    own_clip = (0.2·3 + 0.6·1) / 4 = 0.3; foreign_x = (1·1 + 3·3) / 4 = 2.5; foreign_pos_y = (4·1 + 1·2) / 3 = 2;
    kl = (1·4 + 2·4) / 8 = 1.5; the counts and the loss are not metrics."""
    stats = WeightedMeans()
    record_loss_metrics({"num_own": 3.0, "num_foreign": 1.0, "num_foreign_pos": 1.0, "loss": 9.0, "own_clip": 0.2,
                         "foreign_x": 1.0, "foreign_pos_y": 4.0, "kl": 1.0}, stats)
    record_loss_metrics({"num_own": 1.0, "num_foreign": 3.0, "num_foreign_pos": 2.0, "loss": 9.0, "own_clip": 0.6,
                         "foreign_x": 3.0, "foreign_pos_y": 1.0, "kl": 2.0}, stats)
    merged = merge_weighted([stats.state()])
    assert merged == {"policy/own_clip": pytest.approx(0.3), "policy/foreign_x": pytest.approx(2.5),
                      "policy/foreign_pos_y": pytest.approx(2.0), "policy/kl": pytest.approx(1.5)}
