"""A bf16 tiny agent with tied embeddings, saved the way hub checkpoints are."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def bf16_tied_agent(tmp_path_factory) -> str:
    """A 2-layer Qwen3 (tied embeddings) stored in bfloat16, with its tokenizer."""
    import torch

    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    tokenizer = build_tokenizer("bpe")
    spec = ModelSpec(family="qwen3", hidden_size=64, num_layers=2, num_heads=2, head_dim=32, num_kv_heads=1,
                     intermediate_size=64, tie_word_embeddings=True)
    model = build_model(spec, tokenizer, seed=5).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("agents") / "qwen_bf16"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
