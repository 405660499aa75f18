"""HFGenerateEngine against independent references: a no-cache greedy loop, float64 teacher forcing, and the exact
first-token distribution."""
from __future__ import annotations

import copy

import pytest
import torch
from engine_fixtures import (
    make_bpe_tokenizer,
    make_char_tokenizer,
    make_llama,
    make_qwen3,
    reference_first_token_probs,
    reference_greedy,
    reference_logprobs,
    sharpen,
)

from openrlhf_hacpo.engines import GenerationOutput, HFGenerateEngine, RolloutEngine, SamplingConfig

CHAR_PROMPTS = ["Q: 1+2=?\nA: ", "Q: 33+4=?\nA: ", "Q: 7=?\nA: ", "Q: 12-5+60=?\nA: ", "A: "]
BPE_PROMPTS = ["Q: 12+5=?\nA: ", "Q: 3+21=?\nA: ", "Q: 57+14=?\nA: 7"]


def _models():
    """(model, tokenizer, prompts) for a Llama with a char tokenizer and a Qwen3 with a byte-level BPE."""
    char = make_char_tokenizer()
    bpe = make_bpe_tokenizer()
    return {
        "llama-char": (make_llama(char), char, [char.encode(p) for p in CHAR_PROMPTS]),
        "qwen3-bpe": (make_qwen3(bpe), bpe, [bpe.encode(p) for p in BPE_PROMPTS]),
    }


MODELS = _models()


@pytest.fixture(params=sorted(MODELS))
def agent(request):
    model, tokenizer, prompts = MODELS[request.param]
    return copy.deepcopy(model), tokenizer, prompts


def _check_output_invariants(outputs: list[GenerationOutput], engine: HFGenerateEngine, max_new_tokens: int):
    eos = set(engine.eos_token_ids)
    for out in outputs:
        ids = out.response_token_ids
        assert 1 <= len(ids) <= max_new_tokens
        assert out.response_text == engine.tokenizer.decode(ids, skip_special_tokens=True)
        assert not any(token in eos for token in ids[:-1]), "an EOS inside a response: not cut at the first EOS"
        if out.finished:
            assert out.finish_reason == "stop" and ids[-1] in eos
        else:
            assert out.finish_reason == "length" and len(ids) == max_new_tokens and ids[-1] not in eos


def test_engine_satisfies_protocol(agent):
    model, tokenizer, _ = agent
    assert isinstance(HFGenerateEngine(model, tokenizer), RolloutEngine)


def test_outputs_are_prompt_major_with_n_per_prompt(agent):
    model, tokenizer, prompts = agent
    engine = HFGenerateEngine(model, tokenizer, max_batch_size=5)  # 3-5 prompts x 4 samples -> several chunks
    outputs = engine.generate(prompts, SamplingConfig(n=4, max_new_tokens=10, seed=11))
    expected_order = [(p, s) for p in range(len(prompts)) for s in range(4)]
    assert [(o.prompt_index, o.sample_index) for o in outputs] == expected_order
    _check_output_invariants(outputs, engine, 10)
    # Samples of one prompt are drawn independently: with ~20-300 tokens per step they should not all coincide.
    for p in range(len(prompts)):
        assert len({tuple(o.response_token_ids) for o in outputs[4 * p : 4 * p + 4]}) > 1


def test_greedy_matches_no_cache_reference_loop(agent):
    model, tokenizer, prompts = agent
    model = model.double()  # exact arithmetic: batching / padding / KV cache cannot flip an argmax
    engine = HFGenerateEngine(model, tokenizer, max_batch_size=2)
    outputs = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=12))
    for index, prompt in enumerate(prompts):
        expected, _ = reference_greedy(model, prompt, 12, engine.eos_token_ids)
        assert outputs[index].response_token_ids == expected
    _check_output_invariants(outputs, engine, 12)


def test_checkpoint_generation_defaults_do_not_leak(agent):
    """A checkpoint's generation_config (repetition penalty, n-gram blocking, top-k) must not alter the sampling."""
    model, tokenizer, prompts = agent
    model = model.double()
    eos_ids = HFGenerateEngine(model, tokenizer).eos_token_ids
    expected = [reference_greedy(model, prompt, 12, eos_ids)[0] for prompt in prompts]
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    model.generation_config.top_k = 1
    engine = HFGenerateEngine(model, tokenizer)
    outputs = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=12))
    assert [o.response_token_ids for o in outputs] == expected


def test_cut_after_first_eos_with_rows_finishing_at_different_steps():
    """Rows that stop early are padded by generate(); the engine must return exactly the ids up to the first EOS."""
    tokenizer = make_char_tokenizer()
    model = make_llama(tokenizer).double()
    prompts = [tokenizer.encode(p) for p in CHAR_PROMPTS]
    traces = [reference_greedy(model, prompt, 12, eos_ids=[])[0] for prompt in prompts]
    # Declare as an extra stop id a token that ends some traces early and not others.
    counts = {token: sum(token in trace for trace in traces) for trace in traces for token in trace}
    stop_token = next(t for t, c in sorted(counts.items(), key=lambda kv: kv[0]) if 0 < c < len(traces))
    engine = HFGenerateEngine(model, tokenizer, eos_token_ids=[tokenizer.eos_token_id, stop_token])
    outputs = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=12))
    for trace, out in zip(traces, outputs):
        cut = trace[: trace.index(stop_token) + 1] if stop_token in trace else trace
        assert out.response_token_ids == cut
        assert out.finished == (stop_token in trace)
    assert any(o.finished for o in outputs) and any(not o.finished for o in outputs)


def _eos_always_model(tokenizer):
    """A Llama whose lm_head has a bias making EOS overwhelmingly likely at every step."""
    model = make_llama(tokenizer)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 100.0
    model.lm_head = head
    return model


def test_eos_response_is_kept_and_decodes_to_empty_text(char_tokenizer):
    engine = HFGenerateEngine(_eos_always_model(char_tokenizer), char_tokenizer)
    prompts = [char_tokenizer.encode(p) for p in CHAR_PROMPTS[:3]]
    for sampling in (SamplingConfig(greedy=True, max_new_tokens=8), SamplingConfig(n=2, max_new_tokens=8, seed=1)):
        for out in engine.generate(prompts, sampling):
            assert out.response_token_ids == [char_tokenizer.eos_token_id]
            assert out.response_text == ""
            assert out.finished and out.finish_reason == "stop"


def test_ignoring_eos_runs_to_max_new_tokens(char_tokenizer):
    engine = HFGenerateEngine(_eos_always_model(char_tokenizer), char_tokenizer)
    prompts = [char_tokenizer.encode(p) for p in CHAR_PROMPTS[:2]]
    outputs = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=6, stop_at_eos=False))
    for out in outputs:
        assert out.response_token_ids == [char_tokenizer.eos_token_id] * 6
        assert not out.finished and out.finish_reason == "length"


def test_max_new_tokens_is_respected(agent):
    model, tokenizer, prompts = agent
    engine = HFGenerateEngine(model, tokenizer)
    outputs = engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=3, seed=0, stop_at_eos=False))
    assert all(len(o.response_token_ids) == 3 and o.finish_reason == "length" for o in outputs)


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(agent):
    model, tokenizer, prompts = agent
    engine = HFGenerateEngine(model, tokenizer, max_batch_size=4)
    sampling = SamplingConfig(n=3, max_new_tokens=12).for_step(run_seed=7, step=3)
    state = torch.get_rng_state()
    first = engine.generate(prompts, sampling)
    assert torch.equal(torch.get_rng_state(), state)
    second = engine.generate(prompts, sampling)
    other_step = engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=12).for_step(run_seed=7, step=4))
    ids = lambda outs: [o.response_token_ids for o in outs]  # noqa: E731
    assert ids(first) == ids(second)
    assert ids(first) != ids(other_step)


def test_unseeded_sampling_follows_the_global_rng(agent):
    model, tokenizer, prompts = agent
    engine = HFGenerateEngine(model, tokenizer)
    torch.manual_seed(123)
    first = [o.response_token_ids for o in engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=8))]
    torch.manual_seed(123)
    second = [o.response_token_ids for o in engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=8))]
    assert first == second


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, -1, 1.0), (0.6, 4, 1.0), (1.3, -1, 0.7), (0.8, 6, 0.8)],
)
def test_first_token_distribution_matches_exact_probabilities(char_tokenizer, temperature, top_k, top_p):
    """Monte Carlo: 4000 first tokens vs softmax(logits/T) with top-k/top-p truncation computed in float64."""
    model = sharpen(make_llama(char_tokenizer, seed=3), scale=15.0)
    prompt = char_tokenizer.encode(CHAR_PROMPTS[1])
    expected = reference_first_token_probs(model, prompt, temperature, top_k, top_p)
    engine = HFGenerateEngine(model, char_tokenizer, max_batch_size=4000)
    sampling = SamplingConfig(n=4000, max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    tokens = torch.tensor([o.response_token_ids[0] for o in engine.generate([prompt], sampling)])
    observed = torch.bincount(tokens, minlength=expected.numel()).double() / tokens.numel()
    assert observed[expected == 0].sum() == 0, "sampled a token that top-k / top-p must exclude"
    # Each frequency within 5 binomial standard deviations (plus a floor for tiny probabilities).
    tolerance = 5 * torch.sqrt(expected * (1 - expected) / tokens.numel()) + 2e-3
    assert torch.all((observed - expected).abs() <= tolerance), (observed, expected)
    assert (expected > 0).sum() >= 2, "reference distribution degenerate: the test would not discriminate"


def test_logprobs_are_raw_model_logprobs_of_the_sampled_tokens(agent):
    model, tokenizer, prompts = agent
    engine = HFGenerateEngine(model, tokenizer, max_batch_size=3)
    sampling = SamplingConfig(n=2, max_new_tokens=9, temperature=0.7, top_k=10, seed=2, return_logprobs=True)
    for out in engine.generate(prompts, sampling):
        assert out.logprobs is not None and len(out.logprobs) == len(out.response_token_ids)
        expected = reference_logprobs(model, prompts[out.prompt_index], out.response_token_ids)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_update_weights_copies_into_a_separate_model_and_skips_shared_tensors(char_tokenizer):
    prompts = [char_tokenizer.encode(p) for p in CHAR_PROMPTS]
    greedy = SamplingConfig(greedy=True, max_new_tokens=10)
    source = make_llama(char_tokenizer, seed=1).double()
    target = make_llama(char_tokenizer, seed=2).double()
    expected = [reference_greedy(source, p, 10, [char_tokenizer.eos_token_id])[0] for p in prompts]

    engine = HFGenerateEngine(target, char_tokenizer)
    before = [o.response_token_ids for o in engine.generate(prompts, greedy)]
    assert before != expected
    engine.update_weights(dict(source.named_parameters()))
    assert [o.response_token_ids for o in engine.generate(prompts, greedy)] == expected

    # The policy's own tensors: nothing to copy, the model object is left as it is.
    shared = HFGenerateEngine(source, char_tokenizer)
    pointers = {name: p.data_ptr() for name, p in source.named_parameters()}
    shared.update_weights(list(source.named_parameters()))
    assert {name: p.data_ptr() for name, p in source.named_parameters()} == pointers


def test_update_weights_rejects_unknown_names_and_shapes(char_tokenizer):
    engine = HFGenerateEngine(make_llama(char_tokenizer), char_tokenizer)
    with pytest.raises(KeyError, match="no_such.weight"):
        engine.update_weights({"no_such.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="lm_head.weight"):
        engine.update_weights({"lm_head.weight": torch.zeros(3, 3)})


def test_qwen3_stops_on_every_generation_config_eos(bpe_tokenizer):
    model = make_qwen3(bpe_tokenizer)
    engine = HFGenerateEngine(model, bpe_tokenizer)
    assert engine.eos_token_ids == [bpe_tokenizer.convert_tokens_to_ids("<|im_end|>"), bpe_tokenizer.pad_token_id]


@pytest.mark.parametrize(
    "prompts, match",
    [([], "empty"), ([[1, 2], []], "prompt 1 is empty"), ([[1, 999]], "prompt 0 .*999"), ([[1, 2.5]], "prompt 0")],
)
def test_bad_prompts_are_rejected(char_tokenizer, prompts, match):
    engine = HFGenerateEngine(make_llama(char_tokenizer), char_tokenizer)
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, SamplingConfig())


def test_training_mode_is_restored(char_tokenizer):
    model = make_llama(char_tokenizer).train()
    HFGenerateEngine(model, char_tokenizer).generate([[3, 4]], SamplingConfig(max_new_tokens=2, seed=0))
    assert model.training
