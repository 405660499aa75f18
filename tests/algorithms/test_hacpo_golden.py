"""External check: the 40 float64 golden cases of tests/testdata/hacpo_golden.json (see its README).

Each case gives one learner's rows (own and foreign), the agents' capabilities and the expected advantages,
baselines, stds, coefficients, per-row objectives, loss and d loss / d logp_new, computed by an independent
reference of the official implementation. Everything must agree to 1e-9 absolute in float64.
"""
import json
import pathlib

import pytest
import torch

from openrlhf_hacpo.algorithms import (
    AdvantageConfig,
    PolicyLossConfig,
    PolicyLossInput,
    capability_ratios,
    compute_advantages,
    get_policy_loss,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "testdata" / "hacpo_golden.json"
CASES = json.loads(GOLDEN.read_text())["cases"]
TOL = 1e-9


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


def test_golden_file_has_forty_cases():
    assert len(CASES) == 40


@pytest.mark.parametrize("index", range(len(CASES)))
def test_golden_case(index):
    inputs, expected = CASES[index]["inputs"], CASES[index]["expected"]
    learner = inputs["learner"]
    sources = torch.tensor(inputs["sources"])
    ratios = capability_ratios(f64(inputs["capabilities"]), 0.1, 10.0)

    adv = compute_advantages(
        f64(inputs["rewards"]),
        torch.tensor(inputs["prompt_ids"]),
        sources,
        learner,
        ratios[learner],
        AdvantageConfig(uniform_reward_guard=inputs["uniform_guard"], baseline_guard=inputs["baseline_guard"]),
    )
    torch.testing.assert_close(adv.advantages, f64(expected["advantages"]), rtol=0, atol=TOL)
    torch.testing.assert_close(adv.baselines, f64(expected["baselines"]), rtol=0, atol=TOL)
    torch.testing.assert_close(adv.stds, f64(expected["stds"]), rtol=0, atol=TOL)

    coef = ratios[:, learner][sources]
    torch.testing.assert_close(coef, f64(expected["coefficients"]), rtol=0, atol=TOL)

    logp = f64(inputs["logp_new"]).requires_grad_(True)
    cfg = PolicyLossConfig.of(
        eps_low=inputs["eps_low"], eps_high=inputs["eps_high"], delta=inputs["delta"],
        delta_step=inputs["delta_step"], alpha=inputs["alpha"], log_ratio_clip=inputs["log_ratio_clip"],
        log_ratio_clip_mode="symmetric", kl_coef=0.0,
    )
    out = get_policy_loss("hacpo")(
        PolicyLossInput(
            logp=logp, mask=f64(inputs["mask_new"]), advantages=adv.advantages,
            old_logp_mean=f64(inputs["old_logp_mean"]), is_own=torch.tensor(inputs["is_own"]), coef=coef,
            update_index=inputs["m"],
        ),
        cfg,
    )
    torch.testing.assert_close(out.objectives, f64(expected["objectives"]), rtol=0, atol=TOL)
    assert abs(out.loss.item() - expected["loss"]) <= TOL
    out.loss.backward()
    torch.testing.assert_close(logp.grad, f64(expected["grad"]), rtol=0, atol=TOL)
