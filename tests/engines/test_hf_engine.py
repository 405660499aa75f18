"""The ``hf_engine`` backend's engine (an HFEngine beside the policy) against the policy's own generate, and the CPU
core split between an agent's policy and its engine.

The "policy" here is the agent's model loaded as the policy worker loads it and sampled by ``HFGenerateEngine`` on
that module object (the ``hf`` backend); the engine loads its own copy from the same folder and receives the
policy's weights through the object-store sync path. Tokens must be equal, and both are checked against a
no-cache greedy loop and float64 teacher forcing (engine_fixtures).
"""
from __future__ import annotations

import os
import time

import pytest
import torch
from engine_fixtures import (
    make_bpe_tokenizer,
    make_char_tokenizer,
    make_llama,
    make_qwen3,
    reference_greedy,
    reference_logprobs,
)

from openrlhf_hacpo.engines import HFGenerateEngine, SamplingConfig
from openrlhf_hacpo.engines.hf_engine import HFEngine, bind_process_to_cores, load_generation_model
from openrlhf_hacpo.engines.hf_generate import GENERATE_BATCH_ROWS
from openrlhf_hacpo.engines.settings import CoreShare, split_cpu_cores
from openrlhf_hacpo.engines.weight_sync import push_weights_to_engines

CHAR_PROMPTS = ["Q: 1+2=?\nA: ", "Q: 33+4=?\nA: ", "A: "]
BPE_PROMPTS = ["Q: 12+5=?\nA: ", "Q: 3+21=?\nA: ", "Q: 57+14=?\nA: 7"]


def _save(folder, model, tokenizer) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", params=["llama-char", "qwen3-bpe"])
def agent_folder(request, tmp_path_factory):
    """(model folder, tokenized prompts) of a Llama with a char tokenizer (untied head) and a Qwen3 with a BPE
    tokenizer (tied embeddings, two EOS ids)."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "llama-char":
        tokenizer = make_char_tokenizer()
        path = _save(folder, make_llama(tokenizer, seed=4), tokenizer)
        return path, [tokenizer.encode(p) for p in CHAR_PROMPTS]
    tokenizer = make_bpe_tokenizer()
    path = _save(folder, make_qwen3(tokenizer, seed=5), tokenizer)
    return path, [tokenizer.encode(p) for p in BPE_PROMPTS]


def _policy_engine(path: str):
    """The ``hf`` backend: the policy's module (loaded as ``build_policy_engine`` loads it) sampled in place."""
    from openrlhf_hacpo.models.tokenizer import load_tokenizer

    model = load_generation_model(path, bf16=False, attn_implementation="sdpa", owner="policy")
    model.config.use_cache = False  # as the policy sets it for training
    engine = HFGenerateEngine(model, load_tokenizer(path), max_batch_size=GENERATE_BATCH_ROWS)
    engine.vocab_size = int(model.config.vocab_size)
    return engine


def _tokens_and_logprobs(outputs):
    return [o.response_token_ids for o in outputs], [o.logprobs for o in outputs]


def test_engine_generates_exactly_what_the_policy_generates(agent_folder):
    path, prompts = agent_folder
    policy = _policy_engine(path)
    engine = HFEngine(path, attn_implementation="sdpa", seed=3)
    assert engine.eos_token_ids == policy.eos_token_ids and engine.last_generate_seconds() == 0.0

    greedy = SamplingConfig(n=1, greedy=True, max_new_tokens=12, return_logprobs=True)
    tokens, logprobs = _tokens_and_logprobs(engine.generate(prompts, greedy))
    assert (tokens, logprobs) == _tokens_and_logprobs(policy.generate(prompts, greedy))
    for prompt, response, logp in zip(prompts, tokens, logprobs):  # independent references
        expected, margins = reference_greedy(policy.model, prompt, 12, policy.eos_token_ids)
        agree = next((i for i, m in enumerate(margins) if m < 1e-4), len(margins))  # near-ties may flip
        assert response[:agree] == expected[:agree]
        assert logp == pytest.approx(reference_logprobs(policy.model, prompt, response), abs=1e-5)

    # seeded sampling over more rows than one generate batch: the same cut into batches, the same stream
    sampled = SamplingConfig(n=24, temperature=1.0, max_new_tokens=10, seed=123)
    assert 3 * 24 > GENERATE_BATCH_ROWS
    before = time.perf_counter()
    outputs = engine.generate(prompts, sampled)
    assert 0 < engine.last_generate_seconds() <= time.perf_counter() - before  # the call's own time, this call's
    assert [o.response_token_ids for o in outputs] == [o.response_token_ids for o in policy.generate(prompts, sampled)]
    assert len({tuple(o.response_token_ids) for o in outputs}) > 3, "sampling gave (almost) one response"


def test_weights_synced_through_the_object_store_path_reach_the_engine(agent_folder):
    """After a change of the policy's weights, the sync the trainer runs (PolicyIO's export: every state-dict tensor
    under all its names, tied ones included; then push_weights_to_engines) makes the engine sample what the changed
    policy samples, and not what it sampled before (else the check would prove nothing)."""
    from openrlhf_hacpo.actors.weight_export import gathered_buckets

    path, prompts = agent_folder
    policy = _policy_engine(path)
    engine = HFEngine(path, attn_implementation="sdpa")
    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=10, seed=9, return_logprobs=True)
    before = _tokens_and_logprobs(engine.generate(prompts, sampling))

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    named = [(name, entry.tensor.detach().to("cpu", copy=True))
             for bucket in gathered_buckets(policy.model, zero3=False, bucket_bytes=1 << 20)
             for entry in bucket for name in entry.names]
    push_weights_to_engines([engine], named)

    after = _tokens_and_logprobs(engine.generate(prompts, sampling))
    assert after == _tokens_and_logprobs(policy.generate(prompts, sampling))
    assert after != before
    if engine.model.config.tie_word_embeddings:  # the tie survives the copy under both names
        assert engine.model.lm_head.weight.data_ptr() == engine.model.get_input_embeddings().weight.data_ptr()


def test_a_partial_or_foreign_weight_sync_is_refused(agent_folder):
    path, _ = agent_folder
    engine = HFEngine(path)
    state = dict(engine.model.state_dict())
    name = sorted(state)[0]
    with pytest.raises(ValueError, match=f"left out 1 tensor.*{name}"):
        engine.update_weights([(n, t) for n, t in state.items() if n != name])
    with pytest.raises(KeyError, match="no_such_weight"):
        engine.update_weights({**state, "no_such_weight": torch.zeros(1)})


def test_cores_are_split_between_every_policy_and_engine_when_there_are_enough():
    # two agents with one policy rank and one engine each, on 10 cores: 3, 3, 2, 2 in agent order
    assert split_cpu_cores([2, 2], range(10)) == [[[0, 1, 2], [3, 4, 5]], [[6, 7], [8, 9]]]
    # an agent with two policy ranks, on the cores a process may use (not necessarily from 0)
    assert split_cpu_cores([3, 2], [4, 5, 6, 7, 8]) == [[[4], [5], [6]], [[7], [8]]]
    # fewer cores than busy processes: nothing is pinned, the operating system shares the cores
    assert split_cpu_cores([2, 2], [0, 1]) is None
    share = CoreShare((2, 2), agent=1, process=1)
    assert share.cores(range(16)) == [12, 13, 14, 15] and share.cores([0, 1, 2]) is None
    with pytest.raises(ValueError, match="CoreShare.process 2"):
        CoreShare((2, 2), agent=0, process=2)
    with pytest.raises(ValueError, match="no CPU cores"):
        split_cpu_cores([2], [])


def test_agent_group_gives_the_engine_the_share_after_its_policy_ranks():
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.config import AgentConfig, TrainConfig

    agents = [AgentConfig(name="a", pretrain="/m/a", dp_size=2), AgentConfig(name="b", pretrain="/m/b")]
    cfg = TrainConfig.of(agents=agents, prompt_data="unused.jsonl", rollout_backend="hf_engine", rollout_batch_size=2,
                      n_samples_per_prompt=2, train_batch_size=4, micro_train_batch_size=1)
    group = AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[1], total_updates=1)
    assert group.plan.has_engines and group.weight_sync_mode() == "object_store"
    assert group.plan.core_share(1) == CoreShare((3, 2), agent=1, process=1)
    assert group.plan.core_share(1).cores(range(10)) == [8, 9]


def test_hf_engine_backend_needs_ray_and_a_cpu():
    from openrlhf_hacpo.config import AgentConfig, TrainConfig

    common = dict(agents=[AgentConfig(name="a", pretrain="/m/a")], prompt_data="unused.jsonl",
                  rollout_backend="hf_engine", rollout_batch_size=2, n_samples_per_prompt=2, train_batch_size=2,
                  micro_train_batch_size=1)
    with pytest.raises(ValueError, match="'hf_engine' needs Ray"):
        TrainConfig.of(**common, use_ray=False)
    with pytest.raises(ValueError, match="hf_engine' runs its engines on CPU cores"):
        TrainConfig.of(**common, device="cuda")


def test_binding_to_a_core_this_process_cannot_use_is_refused():
    outside = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=f"cores \\[{outside}\\] are not available"):
        bind_process_to_cores([outside])
    with pytest.raises(ValueError, match="no cores given"):
        bind_process_to_cores([])
