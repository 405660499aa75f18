"""compute_advantages: hand-computed cases of eqs. 6–8, each guard and switch, dtypes, and input errors."""
import math

import pytest
import torch

from hacpo_reference import reference_advantages
from openrlhf_hacpo.algorithms import AdvantageConfig, compute_advantages

EPS = 1e-6


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def run(rewards, prompt_ids, sources, learner, omega, **cfg):
    return compute_advantages(f64(rewards), torch.tensor(prompt_ids), torch.tensor(sources), learner, f64(omega),
                              AdvantageConfig(**cfg))


def test_two_agents_two_samples_by_hand():
    # learner 0 rewards [1, 0]; agent 1 rewards [1, 1]; ω^(0,1) = 0.5
    out = run([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 0.5])
    baseline = (1 + 0 + 0.5 * 1 + 0.5 * 1) / 4  # eq. 7: 0.5
    mean = 0.75
    std = math.sqrt(((1 - mean) ** 2 * 3 + (0 - mean) ** 2) / 3)  # unbiased: 0.5
    expected = [(r - baseline) / (std + EPS) for r in (1.0, 0.0, 1.0, 1.0)]
    assert out.baselines.tolist() == pytest.approx([baseline] * 4, abs=1e-15)
    assert out.stds.tolist() == pytest.approx([std] * 4, abs=1e-15)
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-12)


def test_same_group_different_learner_baselines():
    # learner 1 weights agent 0's rewards by ω^(1,0) = 2: a stronger learner gets a higher bar
    out = run([1.0, 0.0, 1.0, 0.0], [5, 5, 5, 5], [0, 0, 1, 1], 1, [2.0, 1.0])
    assert out.baselines[0].item() == pytest.approx((2 * 1 + 2 * 0 + 1 + 0) / 4)


def test_baseline_guard_falls_back_to_own_mean():
    # μ̂ = (0 + 1 + 4 + 4) / 4 = 2.25 > 1 ⇒ mean of learner 0's own rewards = 0.5
    out = run([0.0, 1.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 4.0])
    assert out.baselines.tolist() == pytest.approx([0.5] * 4)
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 3)
    assert out.advantages.tolist() == pytest.approx([(r - 0.5) / (std + EPS) for r in (0, 1, 1, 1)], abs=1e-12)
    off = run([0.0, 1.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 4.0], baseline_guard=False)
    assert off.baselines.tolist() == pytest.approx([2.25] * 4)


def test_uniform_reward_guard():
    on = run([1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 0.5])
    assert on.advantages.tolist() == [0.0] * 4
    assert on.baselines.tolist() == [1.0] * 4
    off = run([1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 0.5], uniform_reward_guard=False)
    # μ̂ = (1 + 1 + 0.5 + 0.5) / 4 = 0.75 and σ = 0: the unguarded advantage explodes to 0.25 / 1e-6
    assert off.baselines.tolist() == pytest.approx([0.75] * 4)
    assert off.advantages.tolist() == pytest.approx([0.25 / EPS] * 4)


def test_plain_mean_without_capability_weighting():
    out = run([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 0.5], capability_weighting=False)
    assert out.baselines.tolist() == pytest.approx([0.75] * 4)


def test_own_scope_uses_only_learner_rows():
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0]
    out = run(rewards, [3, 3, 3, 3, 3], [0, 0, 0, 1, 1], 0, [1.0, 0.5], scope="own")
    mean = 2 / 3
    std = math.sqrt(((1 - mean) ** 2 * 2 + mean ** 2) / 2)
    assert out.baselines.tolist() == pytest.approx([mean] * 5)
    assert out.stds.tolist() == pytest.approx([std] * 5)
    assert out.advantages[:3].tolist() == pytest.approx([(r - mean) / (std + EPS) for r in rewards[:3]])
    with pytest.raises(ValueError, match="prompt id 4 has no rows from learner 0"):
        run([1.0, 0.0], [3, 4], [0, 1], 0, [1.0, 0.5], scope="own")


def test_without_std_normalisation():
    out = run([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0], [0, 0, 1, 1], 0, [1.0, 0.5], std_normalize=False)
    assert out.advantages.tolist() == pytest.approx([0.5, -0.5, 0.5, 0.5])  # eq. 15: R − μ̂


def test_group_of_one_uses_unit_std():
    out = run([0.75], [0], [1], 0, [1.0, 0.5], uniform_reward_guard=False)
    assert out.stds.tolist() == [1.0]
    assert out.advantages.tolist() == pytest.approx([(0.75 - 0.375) / (1.0 + EPS)])


def test_groups_are_formed_by_prompt_id_in_any_order():
    rewards = [1.0, 0.2, 0.0, 0.9, 0.4, 0.3, 0.0, 1.0]
    prompt_ids = [7, 3, 7, 3, 3, 7, 7, 3]
    sources = [0, 1, 1, 0, 0, 0, 1, 1]
    omega = [1.0, 0.25]
    out = run(rewards, prompt_ids, sources, 0, omega)
    adv, base, std = reference_advantages(rewards, prompt_ids, sources, 0, omega)
    assert out.advantages.tolist() == pytest.approx(adv, abs=1e-12)
    assert out.baselines.tolist() == pytest.approx(base, abs=1e-15)
    assert out.stds.tolist() == pytest.approx(std, abs=1e-15)


def test_dtypes_and_omega_none():
    out32 = compute_advantages(torch.tensor([1.0, 0.0], dtype=torch.float32), torch.tensor([0, 0]),
                               torch.tensor([0, 1]), 0, torch.tensor([1.0, 0.5]))
    assert out32.advantages.dtype == torch.float32
    out_int = compute_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([0, 0]), 0, None)
    assert out_int.advantages.dtype == torch.float32
    assert out_int.baselines.tolist() == pytest.approx([0.5, 0.5])


def test_equal_group_sizes_check():
    ok = dict(rewards=[1.0, 0.0, 1.0, 0.0], prompt_ids=[0, 0, 0, 0], sources=[0, 0, 1, 1])
    run(**ok, learner=0, omega=[1.0, 1.0], require_equal_group_sizes=True)
    with pytest.raises(ValueError, match=r"unequal samples per source: prompt id 0 has counts \{0: 1, 1: 3\}"):
        run([1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], [0, 1, 1, 1], 0, [1.0, 1.0], require_equal_group_sizes=True)
    # a source missing from one prompt also counts as unequal
    with pytest.raises(ValueError, match="prompt id 9"):
        run([1.0, 0.0, 1.0], [2, 2, 9], [0, 1, 0], 0, [1.0, 1.0], require_equal_group_sizes=True)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(rewards=[1.0, float("nan")]), ValueError, "rewards contains NaN or inf"),
        (dict(rewards=[1.0, float("inf")]), ValueError, "rewards contains NaN or inf"),
        (dict(rewards=[]), ValueError, "rewards is empty"),
        (dict(rewards=[[1.0, 0.0]]), ValueError, "rewards must be 1-D"),
        (dict(prompt_ids=[0, 0, 0]), ValueError, r"prompt_ids must have shape \[2\]"),
        (dict(sources=[0]), ValueError, r"sources must have shape \[2\]"),
        (dict(sources=[0, 2]), ValueError, "unknown agent index 2"),
        (dict(sources=[-1, 0]), ValueError, "unknown agent index -1"),
        (dict(learner=2), ValueError, r"learner must be an agent index in \[0, 2\)"),
        (dict(omega=[1.0, 0.0]), ValueError, "omega must be finite and > 0"),
        (dict(omega=[1.0, -2.0]), ValueError, "omega must be finite and > 0"),
        (dict(omega=[1.0, float("nan")]), ValueError, "omega must be finite and > 0"),
        (dict(omega=[0.5, 1.0]), ValueError, r"omega\[learner\]"),
        (dict(omega=[]), ValueError, "omega must be a non-empty 1-D tensor"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = dict(rewards=[1.0, 0.0], prompt_ids=[0, 0], sources=[0, 1], learner=0, omega=[1.0, 0.5])
    args.update(kwargs)
    rewards = torch.tensor(args["rewards"], dtype=torch.float64)
    with pytest.raises(error, match=match):
        compute_advantages(rewards, torch.tensor(args["prompt_ids"], dtype=torch.long),
                           torch.tensor(args["sources"], dtype=torch.long), args["learner"],
                           torch.tensor(args["omega"], dtype=torch.float64))


def test_float_ids_are_rejected():
    with pytest.raises(ValueError, match="prompt_ids must be an integer tensor"):
        compute_advantages(f64([1.0]), f64([0.0]), torch.tensor([0]), 0, f64([1.0]))


def test_baseline_guard_without_own_rows_is_an_error():
    with pytest.raises(ValueError, match="baseline guard: prompt id 1"):
        run([1.0, 0.0], [1, 1], [1, 1], 0, [1.0, 3.0])
