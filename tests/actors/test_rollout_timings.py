"""A policy rank's rollout times its two phases with one PhaseTimer: ``generate`` (rendering and sampling) and
``scoring`` (the old-log-prob recompute); a rank that scores the engines' responses times ``scoring`` only. Either
call adds ``rollout_rest``, its time outside those phases."""
from __future__ import annotations

import time
from types import SimpleNamespace

from openrlhf_hacpo.actors.deepspeed_setup import EngineStateSleep
from openrlhf_hacpo.actors.policy import PolicyWorker
from openrlhf_hacpo.actors.scoring import RenderedPrompts
from openrlhf_hacpo.engines.base import GenerationOutput

GENERATE_S = 0.2
SCORE_S = 0.1
REST_S = 0.05  # work of the call outside its phases


class Scorer:
    def render(self, prompts):
        return RenderedPrompts(ids=[[1]] * len(prompts), texts=["q"] * len(prompts))

    def trajectories(self, model, prompts, rendered, outputs, step, device, timer):
        with timer.phase("scoring"):
            time.sleep(SCORE_S)
        return []

    def scoring_positions(self, rendered, outputs):
        time.sleep(REST_S)
        return 10 * len(outputs), 7 * len(outputs)


class Engine:
    def generate(self, prompt_ids, sampling):
        time.sleep(GENERATE_S)
        return [GenerationOutput(i, 0, [5, 6, 7], "", False, "length") for i in range(len(prompt_ids))]


def worker() -> PolicyWorker:
    w = PolicyWorker.__new__(PolicyWorker)
    w.scorer, w.hf_engine, w.engine, w.device = Scorer(), Engine(), None, "cpu"
    w.states = EngineStateSleep(None, enabled=False)  # deepspeed_enable_sleep off: sleep() / wake() do nothing
    return w


def test_rollout_times_generate_and_scoring_apart():
    result = worker().rollout([SimpleNamespace(prompt="q")] * 2, SimpleNamespace(n=1), step=1)
    assert set(result.timings) == {"generate", "scoring", "rollout_rest"}
    assert GENERATE_S <= result.timings["generate"] < GENERATE_S + SCORE_S  # the scoring is not in it
    assert SCORE_S <= result.timings["scoring"] < SCORE_S + REST_S
    assert REST_S <= result.timings["rollout_rest"] < REST_S + SCORE_S
    assert result.generated_tokens == 6
    assert (result.scoring_positions, result.scoring_tokens) == (20, 14)


def test_scoring_engine_outputs_times_scoring_only():
    outputs = [GenerationOutput(0, 0, [5, 6], "", True, "stop")]
    result = worker().score_engine_outputs([SimpleNamespace(prompt="q")], RenderedPrompts([[1]], ["q"]), [0], [[0]],
                                           1, outputs)
    assert set(result.timings) == {"scoring", "rollout_rest"}
    assert SCORE_S <= result.timings["scoring"] < SCORE_S + REST_S
    assert REST_S <= result.timings["rollout_rest"] < REST_S + SCORE_S
    assert result.generated_tokens == 2
