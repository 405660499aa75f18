"""A vLLM rollout as one pending, with stand-in Ray actors for the engines and the policy ranks (no vLLM, no model).

The group starts generation and scoring at once: each scoring call takes the engines' results as Ray arguments.
With sleeping engines every engine is put back to sleep before any rank starts scoring (the policies share the GPU
with colocated engines), generation time is measured to the end of generation, and every rank scores exactly its
own prompts' responses.
"""
from __future__ import annotations

import time

import pytest

from openrlhf_hacpo.actors.agent_group import AgentGroup
from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.data.prompts import PromptRecord
from openrlhf_hacpo.engines.base import SamplingConfig

pytestmark = pytest.mark.e2e

GENERATE_S = 0.5
SLEEP_S = 0.3


@pytest.fixture
def ray_local():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    if started:
        ray.shutdown()


def test_engines_sleep_before_any_rank_scores_and_each_rank_gets_its_prompts(ray_local, tmp_path):
    ray = ray_local
    from openrlhf_hacpo.actors.results import RolloutResult
    from openrlhf_hacpo.actors.scoring import RenderedPrompts
    from openrlhf_hacpo.actors.sharding import outputs_for_shard
    from openrlhf_hacpo.engines.base import GenerationOutput

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self) -> None:
            self.slept_at: list[float] = []

        def generate(self, prompt_ids, sampling):
            started = time.perf_counter()
            time.sleep(GENERATE_S)
            self.generate_s = time.perf_counter() - started
            return [GenerationOutput(prompt_index=i, sample_index=s, response_token_ids=[ids[0]] * (s + 1),
                                     response_text="", finished=True, finish_reason="stop")
                    for i, ids in enumerate(prompt_ids) for s in range(sampling.n)]

        def last_generate_seconds(self) -> float:
            return self.generate_s

        def sleep(self, level: int = 1) -> None:
            time.sleep(SLEEP_S)
            self.slept_at.append(time.time())

        def wake_up(self) -> None:
            pass

        def sleeps(self) -> list[float]:
            return self.slept_at

    @ray.remote(num_cpus=0)
    class Policy:
        def __init__(self) -> None:
            self.started_at: list[float] = []

        def render(self, prompts):
            return RenderedPrompts(ids=[[int(p.prompt_id)] for p in prompts], texts=[p.prompt for p in prompts])

        def score_engine_outputs(self, prompts, rendered, shard, engine_shards, step, *engine_outputs):
            self.started_at.append(time.time())
            outputs = outputs_for_shard(shard, engine_shards, engine_outputs)
            # every response's first token is its prompt's id: a response scored for the wrong prompt shows here
            assert all(o.response_token_ids[0] == int(prompts[o.prompt_index].prompt_id) for o in outputs)
            assert rendered.ids == [[int(p.prompt_id)] for p in prompts]
            return RolloutResult(trajectories=(), timings={"scoring": 0.01 * len(shard)},
                                 generated_tokens=sum(o.num_tokens for o in outputs))

        def starts(self) -> list[float]:
            return self.started_at

    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path", str(tmp_path),
                        "--rollout_backend", "vllm", "--n_samples_per_prompt", "2", "--rollout_batch_size", "5",
                        "--train_batch_size", "10", "--micro_train_batch_size", "1"])
    group = AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=1)
    group.engines = [Engine.remote(), Engine.remote()]
    group.policies = [Policy.remote(), Policy.remote()]
    group.rollouts.engines_sleep = True
    prompts = [PromptRecord(str(10 + i), f"q{i}", "0") for i in range(5)]

    result = group.rollout(prompts, SamplingConfig(n=2, max_new_tokens=4, seed=1), step=1).result()

    # 5 prompts x 2 samples of 1 and 2 tokens; the ranks score 3 and 2 prompts (scoring is the slowest rank's)
    assert result.generated_tokens == 5 * (1 + 2)
    assert set(result.timings) == {"generate", "engine_generate", "scoring"}
    assert result.timings["scoring"] == pytest.approx(0.03)
    # an upper bound only: the machine may be loaded
    assert GENERATE_S <= result.timings["generate"] < GENERATE_S + 120
    # the engines' own time in generate: the slowest engine's
    engine_s = max(ray.get([e.last_generate_seconds.remote() for e in group.engines]))
    assert result.timings["engine_generate"] == engine_s >= GENERATE_S
    sleeps = [t for e in group.engines for t in ray.get(e.sleeps.remote())]
    starts = [t for p in group.policies for t in ray.get(p.starts.remote())]
    assert len(sleeps) == 2 and len(starts) == 2
    assert min(starts) >= max(sleeps)
    assert not group.rollouts.engines_awake
