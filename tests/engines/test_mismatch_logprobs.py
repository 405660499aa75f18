"""Asking an engine for its log-probs of the sampled tokens (the mismatch/* metrics, --mismatch_metrics) samples
the same tokens and leaves the caller's random stream as it was."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from engine_fixtures import make_char_tokenizer, make_llama

from openrlhf_hacpo.actors.scoring import mismatch_sampling
from openrlhf_hacpo.engines import HFGenerateEngine, SamplingConfig


def test_asking_for_log_probs_samples_the_same_tokens():
    tokenizer = make_char_tokenizer()
    model = make_llama(tokenizer)
    prompts = [tokenizer.encode(p) for p in ["Q: 1+2=?\nA: ", "Q: 33+4=?\nA: ", "A: "]]
    engine = HFGenerateEngine(model, tokenizer, max_batch_size=2)
    plain = SamplingConfig(n=3, max_new_tokens=12, temperature=1.0, seed=5)
    cfg = SimpleNamespace(engines=SimpleNamespace(mismatch_metrics=True), rollout=SimpleNamespace(temperature=1.0),
                          compute=SimpleNamespace(old_logp_from_update=False))
    asked = mismatch_sampling(cfg, plain)
    assert asked.return_logprobs and not plain.return_logprobs
    torch.manual_seed(123)
    without = engine.generate(prompts, plain)
    after_without = torch.rand(3)
    torch.manual_seed(123)
    with_logps = engine.generate(prompts, asked)
    after_with = torch.rand(3)
    assert [o.response_token_ids for o in with_logps] == [o.response_token_ids for o in without]
    assert torch.equal(after_with, after_without)  # the caller's random stream is untouched either way
    assert all(o.logprobs is not None and len(o.logprobs) == len(o.response_token_ids) for o in with_logps)
    assert all(o.logprobs is None for o in without)
