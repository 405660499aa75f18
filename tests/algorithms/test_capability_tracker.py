"""CapabilityTracker: per-step capability, K-step window, floor, clipped ratios, warm-up, state round trip."""
import json
import math

import pytest
import torch

from openrlhf_hacpo.algorithms import CapabilityConfig, CapabilityTracker, capability_ratios, step_capability


def rewards_with_rate(rate, size=20):
    """A reward tensor of ``size`` entries of which round(rate·size) are 1 and the rest 0."""
    positives = round(rate * size)
    return torch.tensor([1.0] * positives + [0.0] * (size - positives))


def test_step_capability_metrics():
    r = torch.tensor([1.0, 0.0, 0.5, -1.0])
    assert step_capability(r, "positive_rate") == pytest.approx(2 / 4)  # 1.0 and 0.5 are > 0
    assert step_capability(r, "mean_reward") == pytest.approx(0.5 / 4)


def test_window_includes_current_step_and_drops_old_steps():
    tracker = CapabilityTracker(2, CapabilityConfig(window=3))
    caps = tracker.update([rewards_with_rate(0.1), rewards_with_rate(0.9)]).smoothed
    # the window includes the current step: after one update P̂ is that step's value
    assert caps.tolist() == pytest.approx([0.1, 0.9])
    for rate_a, rate_b in [(0.2, 0.8), (0.3, 0.7), (0.4, 0.6)]:
        caps = tracker.update([rewards_with_rate(rate_a), rewards_with_rate(rate_b)]).smoothed
    # K = 3: the first step (0.1 / 0.9) has left the window
    assert caps.tolist() == pytest.approx([(0.2 + 0.3 + 0.4) / 3, (0.8 + 0.7 + 0.6) / 3])
    assert caps.dtype == torch.float64


def test_update_returns_this_steps_capability_beside_the_window_mean():
    tracker = CapabilityTracker(2, CapabilityConfig(window=2))
    tracker.update([rewards_with_rate(0.5), rewards_with_rate(0.25)])
    out = tracker.update([rewards_with_rate(1.0), rewards_with_rate(0.75)])
    assert out.step.tolist() == pytest.approx([1.0, 0.75])  # P_τ of this step alone
    assert out.smoothed.tolist() == pytest.approx([0.75, 0.5])  # P̂ over the window of 2


def test_mean_reward_metric_uses_reward_values():
    tracker = CapabilityTracker(1, CapabilityConfig(metric="mean_reward", window=2))
    tracker.update([torch.tensor([0.5, 0.25])])
    caps = tracker.update([torch.tensor([1.0, 0.0, 0.5])]).smoothed
    assert caps.tolist() == pytest.approx([(0.375 + 0.5) / 2])


def test_floor_and_ratio_clip():
    tracker = CapabilityTracker(3)
    caps = tracker.update([torch.zeros(8), rewards_with_rate(0.5, 8), rewards_with_rate(0.25, 8)]).smoothed
    assert caps.tolist() == pytest.approx([1e-8, 0.5, 0.25])
    ratios = tracker.ratio_matrix()
    expected = [
        [1.0, 0.1, 0.1],  # 1e-8 / 0.5 clipped up to 0.1
        [10.0, 1.0, 2.0],  # 0.5 / 1e-8 clipped down to 10
        [10.0, 0.5, 1.0],
    ]
    torch.testing.assert_close(ratios, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert tracker.ratio(1, 2) == pytest.approx(2.0)
    assert tracker.ratios().baseline_weights(2).tolist() == pytest.approx([10.0, 0.5, 1.0])  # ω^(k,j) = R[k, j]
    assert tracker.ratios().coefficients(2).tolist() == pytest.approx([0.1, 2.0, 1.0])  # ω^(j,k) = R[j, k]


def test_unclipped_ratios_for_paper_variant():
    caps = torch.tensor([1e-3, 0.5], dtype=torch.float64)
    ratios = capability_ratios(caps, 0.0, math.inf)
    assert ratios[1, 0].item() == pytest.approx(500.0)
    assert ratios[0, 1].item() == pytest.approx(0.002)


def test_warmup_and_before_first_update_give_unit_ratios():
    tracker = CapabilityTracker(2, CapabilityConfig(warmup_steps=2))
    assert torch.equal(tracker.ratio_matrix(), torch.ones(2, 2, dtype=torch.float64))
    for _ in range(2):
        tracker.update([rewards_with_rate(0.2), rewards_with_rate(0.8)])
        assert tracker.in_warmup
        assert torch.equal(tracker.ratio_matrix(), torch.ones(2, 2, dtype=torch.float64))
    tracker.update([rewards_with_rate(0.2), rewards_with_rate(0.8)])
    assert not tracker.in_warmup
    assert tracker.ratio(1, 0) == pytest.approx(4.0)


def test_state_dict_round_trip_through_json():
    cfg = CapabilityConfig(window=2)
    tracker = CapabilityTracker(2, cfg)
    for rates in [(0.1, 0.3), (0.2, 0.6), (0.4, 0.5)]:
        tracker.update([rewards_with_rate(rates[0]), rewards_with_rate(rates[1])])
    state = json.loads(json.dumps(tracker.state_dict()))
    restored = CapabilityTracker(2, cfg)
    restored.load_state_dict(state)
    assert torch.equal(restored.ratio_matrix(), tracker.ratio_matrix())
    assert restored.num_updates == 3
    # both continue identically
    step = [rewards_with_rate(0.7), rewards_with_rate(0.1)]
    assert torch.equal(restored.update(step).smoothed, tracker.update(step).smoothed)
    with pytest.raises(ValueError, match="for 2 agents"):
        CapabilityTracker(3, cfg).load_state_dict(state)
    with pytest.raises(ValueError, match="missing 'history'"):
        CapabilityTracker(2, cfg).load_state_dict({"num_agents": 2, "num_updates": 1})


@pytest.mark.parametrize(
    "rewards, error, match",
    [
        ([torch.ones(3)], ValueError, "expected one per agent"),
        ([torch.ones(3), torch.tensor([1.0, float("nan")])], ValueError, r"per_agent_rewards\[1\] contains NaN"),
        ([torch.tensor([float("inf")]), torch.ones(2)], ValueError, r"per_agent_rewards\[0\] contains NaN or inf"),
        ([torch.ones(3), torch.zeros(0)], ValueError, r"per_agent_rewards\[1\] is empty"),
        ([torch.ones(3), [1.0]], TypeError, "must be a torch.Tensor"),
        (torch.ones(2, 3), TypeError, "one reward tensor per agent"),
    ],
)
def test_update_rejects_bad_rewards(rewards, error, match):
    tracker = CapabilityTracker(2)
    with pytest.raises(error, match=match):
        tracker.update(rewards)
    assert tracker.num_updates == 0  # nothing recorded


def test_bad_agent_indices_and_sizes():
    with pytest.raises(ValueError, match="num_agents"):
        CapabilityTracker(0)
    tracker = CapabilityTracker(2)
    with pytest.raises(ValueError, match=r"agent index in \[0, 2\)"):
        tracker.ratio(0, 2)
    with pytest.raises(ValueError, match="learner"):
        tracker.ratios().baseline_weights(-1)
    with pytest.raises(ValueError, match="capabilities must be finite and > 0"):
        capability_ratios(torch.tensor([0.5, 0.0]))
