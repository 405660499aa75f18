"""Model shapes against hand-counted parameter totals, tied embeddings, sdpa, seeded init."""
import pytest
import torch

from openrlhf_hacpo.zoo import AGENTS, ModelSpec, build_model, build_tokenizer
from openrlhf_hacpo.zoo.models import num_parameters


def _expected_params(vocab, hidden, layers, heads, head_dim, inter, qk_norm):
    attn = 2 * hidden * heads * head_dim + 2 * hidden * heads * head_dim  # q, o and k, v (kv heads = heads)
    per_layer = attn + 3 * hidden * inter + 2 * hidden + (2 * head_dim if qk_norm else 0)
    return vocab * hidden + layers * per_layer + hidden  # tied embeddings + final norm


@pytest.mark.parametrize(
    "name, cls, shape",
    [
        ("llamaS", "LlamaForCausalLM", (64, 2, 4, 16, 192, False)),
        ("qwenM", "Qwen3ForCausalLM", (96, 3, 4, 24, 288, True)),
        ("qwenS", "Qwen3ForCausalLM", (64, 2, 4, 16, 192, True)),
    ],
)
def test_agent_architectures(name, cls, shape):
    spec = AGENTS[name]
    tok = build_tokenizer(spec.tokenizer)
    model = build_model(spec.model, tok, seed=0)
    assert type(model).__name__ == cls
    assert num_parameters(model) == _expected_params(len(tok), *shape)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config._attn_implementation == "sdpa"
    assert model.config.max_position_embeddings == 128
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id


def test_init_depends_only_on_seed():
    tok = build_tokenizer("char")
    spec = AGENTS["llamaS"].model
    a, b, c = build_model(spec, tok, seed=1), build_model(spec, tok, seed=1), build_model(spec, tok, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"family": "gpt2"}, "family"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_heads": 5}, "num_heads"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
    ],
)
def test_model_spec_validation(kwargs, field):
    base = dict(family="llama", hidden_size=64, num_layers=2, num_heads=4)
    with pytest.raises(ValueError, match=field):
        ModelSpec(**{**base, **kwargs})
