"""One agent's metrics record: the rollout's phase times (``time/generate``, ``time/scoring``), ``time/logprob``,
``rollout/tokens_per_s`` and ``time/wait`` computed from the phase mappings, by hand."""
from __future__ import annotations

import pytest
import torch

from openrlhf_hacpo.actors.results import RolloutResult, TrainStepResult
from openrlhf_hacpo.algorithms import CapabilityRatios, CapabilityStep
from openrlhf_hacpo.trainer.step_metrics import LEARNER_PHASES, ROLLOUT_PHASES, agent_step_record

SUMMARY = {"reward_mean": 0.5, "reward_std": 0.5, "positive_rate": 0.5, "response_tokens_mean": 3.0,
           "response_chars_mean": 9.0, "finished_rate": 1.0}
DRIVER = {"rollout_phase": 10.0, "reward": 0.25, "capability": 0.125, "train_phase": 20.0, "step": 31.0}
LEARNER = {"view": 1.0, "advantages": 0.5, "reference": 2.0, "probe": 0.5, "update": 12.0}


def traj(i: int, finish_reason: str = "stop"):
    from openrlhf_hacpo.rollout import make_trajectory

    return make_trajectory(prompt_id=f"p{i}", prompt="q", label=None, source=0, step=1, token_ids=[5, 6],
                           token_logps=[-1.0, -1.0], eos_token_id=2, response_text="ab", finish_reason=finish_reason)


def record(rollout: RolloutResult) -> dict:
    trained = TrainStepResult(metrics={"loss": 0.1}, skipped_updates=0, skipped_updates_total=1, updates=2,
                              timings=dict(LEARNER))
    capability = CapabilityStep(step=torch.tensor([0.5, 0.25], dtype=torch.float64),
                                smoothed=torch.tensor([0.5, 0.25], dtype=torch.float64))
    ratios = CapabilityRatios(torch.tensor([[1.0, 2.0], [0.5, 1.0]]))
    own = [traj(0), traj(1, "length")]
    return agent_step_record(3, 0, ["a", "b"], SUMMARY, own, capability, ratios, rollout, trained, DRIVER, 0.75)


def test_rollout_phase_times_and_the_figures_made_from_them():
    rec = record(RolloutResult(trajectories=(), timings={"generate": 4.0, "scoring": 1.5}, generated_tokens=1000))
    assert rec["time/generate"] == 4.0 and rec["time/scoring"] == 1.5
    assert rec["time/logprob"] == 1.5 + 2.0  # scoring + the learner's reference pass
    assert rec["rollout/tokens_per_s"] == 1000 / 4.0  # sampled tokens per second of generation
    assert rec["perf/tokens_generated"] == 1000.0 and rec["response/truncated_fraction"] == 0.5
    assert rec["time/wait"] == (10.0 - 5.5) + (20.0 - 16.0)
    assert {f"time/{name}" for name in LEARNER_PHASES} <= set(rec) and rec["time/update"] == 12.0
    assert (rec["time/sync"], rec["time/step"], rec["omega/b"], rec["loss"]) == (0.75, 31.0, 2.0, 0.1)
    # the keys keep their place in the record (metrics.jsonl column order)
    keys = list(rec)
    assert keys[keys.index("perf/tokens_generated") + 1:][:5] == ["time/generate", "time/scoring", "time/rollout_rest",
                                                                 "time/engine_generate", "time/reward"]


def test_the_engines_own_generate_time_is_reported_apart_from_the_wait():
    # engine actors: their own seconds in generate (inside the driver's generate phase), not a phase of the wait
    timings = {"generate": 4.0, "engine_generate": 2.5, "scoring": 1.5}
    rec = record(RolloutResult(trajectories=(), timings=timings, generated_tokens=1000))
    assert (rec["time/generate"], rec["time/engine_generate"]) == (4.0, 2.5)
    assert rec["time/wait"] == (10.0 - 5.5) + (20.0 - 16.0) and rec["rollout/tokens_per_s"] == 1000 / 4.0
    # the policy generating itself (hf): its generate phase is the generating process's own time
    rec = record(RolloutResult(trajectories=(), timings={"generate": 4.0, "scoring": 1.5}, generated_tokens=1000))
    assert rec["time/engine_generate"] == 4.0


def test_a_phase_the_rollout_did_not_time_counts_zero():
    rec = record(RolloutResult(trajectories=(), timings={"scoring": 1.0}, generated_tokens=0))
    assert rec["time/generate"] == 0.0 and rec["rollout/tokens_per_s"] == 0.0
    assert [f"time/{n}" in rec for n in ROLLOUT_PHASES] == [True, True, True]


def test_combine_takes_the_slowest_rank_per_phase():
    parts = [RolloutResult(trajectories=(traj(0), traj(1)), timings={"generate": 3.0, "scoring": 0.5},
                           generated_tokens=7),
             RolloutResult(trajectories=(traj(2),), timings={"generate": 1.0, "scoring": 2.0}, generated_tokens=4),
             RolloutResult(trajectories=(), timings={"scoring": 0.25}, generated_tokens=0)]
    combined = RolloutResult.combine(parts)
    assert combined.timings == {"generate": 3.0, "scoring": 2.0}  # not the sum, not rank 0's
    assert [t.prompt_id for t in combined.trajectories] == ["p0", "p1", "p2"]  # rank order
    assert combined.generated_tokens == 11
    assert RolloutResult.combine(parts[:1]).timings == {"generate": 3.0, "scoring": 0.5}
    with pytest.raises(Exception):
        combined.timings = {}  # frozen


def test_scoring_padding_fraction_and_its_combination():
    parts = [RolloutResult(trajectories=(), timings={"scoring": 1.0}, generated_tokens=0, scoring_positions=100,
                           scoring_tokens=80),
             RolloutResult(trajectories=(), timings={"scoring": 1.0}, generated_tokens=0, scoring_positions=60,
                           scoring_tokens=60)]
    combined = RolloutResult.combine(parts)
    assert (combined.scoring_positions, combined.scoring_tokens) == (160, 140)
    assert record(combined)["perf/pad_frac_scoring"] == pytest.approx(20 / 160)
    assert "perf/pad_frac_scoring" not in record(RolloutResult(trajectories=(), timings={}, generated_tokens=0))
