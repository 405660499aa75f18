"""LoRA agents (openrlhf_hacpo/actors/lora.py) on tiny in-memory models: the merged export is the base model's state
dict with W + (α/r)·B·A (against float64 by hand), the adapter-disabled reference is the base model, only the
adapter trains, and the config fields validate and inherit."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from openrlhf_hacpo.actors.agent_plan import LoraPlan, plan_agents
from openrlhf_hacpo.actors.lora import AdapterDisabledReference, apply_lora, merged_entries
from openrlhf_hacpo.actors.weight_export import export_entries, weight_entries
from openrlhf_hacpo.config import AgentConfig, TrainConfig

pytest.importorskip("peft")

RANK, ALPHA = 4, 8


def _llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _agent(**settings) -> AgentConfig:
    values = dict(name="a", pretrain="unused", lora_rank=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                  target_modules="all-linear")
    values.update(settings)
    return AgentConfig(**values)


def _apply(model: torch.nn.Module, agent: AgentConfig) -> torch.nn.Module:
    """:func:`apply_lora` with the LoRA of ``agent``'s plan, as a policy worker applies it."""
    (plan,) = plan_agents(TrainConfig.of(agents=[agent], prompt_data="d"), on_gpu=False)
    return apply_lora(model, plan.lora, agent.name)


def _with_trained_adapter(model: torch.nn.Module, agent: AgentConfig, seed: int = 1) -> torch.nn.Module:
    """``model`` wrapped with LoRA whose B (zero at the start) is random, as after training."""
    wrapped = _apply(model, agent)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return wrapped


def _peft_tensor(model, name: str, part: str) -> torch.Tensor:
    """The ``part`` tensor (``base_layer``, ``lora_A.default``, ``lora_B.default``) of the module of base name ``name``."""
    module_name = name.removesuffix(".weight")
    params = dict(model.named_parameters())
    return params[f"base_model.model.{module_name}.{part}.weight"].detach().double()


def test_merged_export_is_the_base_state_dict_plus_the_scaled_low_rank_update():
    base = _llama()
    original = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = _with_trained_adapter(copy.deepcopy(base), _agent())
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}

    entries = export_entries(peft_model)
    exported = {name: entry.merged().tensor for entry in entries for name in entry.names}
    assert list(exported) == list(original)  # the base model's names, in its state-dict order
    adapted = [name for entry in entries if entry.deltas for name in entry.names]
    assert len(adapted) == 2 * 7  # q, k, v, o, gate, up, down of 2 layers; never the output head
    for name, tensor in exported.items():
        assert tensor.shape == original[name].shape and tensor.dtype == original[name].dtype
        if name in adapted:
            a, b = _peft_tensor(peft_model, name, "lora_A.default"), _peft_tensor(peft_model, name, "lora_B.default")
            expected = original[name].double() + (ALPHA / RANK) * (b @ a)
            assert torch.allclose(tensor.double(), expected, rtol=0, atol=1e-6), name
            assert not torch.allclose(tensor, original[name])
        else:
            assert torch.equal(tensor, original[name]), name
    for name, param in peft_model.named_parameters():  # the export touched neither the adapter nor W
        assert torch.equal(param, before[name]), name


def test_merged_weights_in_the_base_model_give_the_adapted_logits():
    base = _llama()
    peft_model = _with_trained_adapter(copy.deepcopy(base), _agent())
    merged = _llama(seed=9)
    merged.load_state_dict({n: e.merged().tensor for e in export_entries(peft_model) for n in e.names})
    ids = torch.tensor([[1, 5, 7, 2, 9, 11]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft_model(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(merged(ids).logits, base(ids).logits, atol=1e-3)


def test_disabled_adapter_reference_scores_the_base_model():
    base = _llama()
    peft_model = _with_trained_adapter(copy.deepcopy(base), _agent(lora_dropout=0.5)).train()
    reference = AdapterDisabledReference(peft_model, pad_token_id=0, micro_batch_size=2, device=torch.device("cpu"),
                                         logprob_path="logits", kernel_backend="torch")
    prompts, responses = [[1, 5, 7], [3, 4], [8, 2, 6, 1]], [[9, 11, 2], [4], [5, 5]]
    values = reference.compute_logprobs(prompts, responses, temperature=1.0)
    assert peft_model.training  # its mode is restored
    for prompt, response, got in zip(prompts, responses, values):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = base(ids).logits[0, len(prompt) - 1:-1].double()
            adapted = peft_model.eval()(input_ids=ids).logits[0, len(prompt) - 1:-1].double()
        peft_model.train()
        index = torch.tensor(response)[:, None]
        expected = torch.log_softmax(logits, -1).gather(-1, index)[:, 0]
        assert torch.allclose(got.double(), expected, atol=1e-5)
        assert not torch.allclose(got.double(), torch.log_softmax(adapted, -1).gather(-1, index)[:, 0], atol=1e-3)


def test_only_the_adapter_requires_gradients_also_with_gradient_checkpointing():
    model = _llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    peft_model = _apply(model, _agent(target_modules="q_proj, v_proj"))
    trainable = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    hidden, kv = 32, 16  # q_proj: 32 -> 32, v_proj: 32 -> 16, 2 layers
    assert sum(p.numel() for p in trainable.values()) == 2 * (RANK * (hidden + hidden) + RANK * (hidden + kv))
    peft_model.train()
    peft_model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    # B starts at 0, so only B gets a gradient on the first step (dL/dA = B^T ...)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in trainable.items() if "lora_B" in n)
    assert all(p.grad is None for n, p in peft_model.named_parameters() if not p.requires_grad)


def test_rank_zero_leaves_the_model_alone():
    model = _llama()
    assert _apply(model, _agent(lora_rank=0)) is model
    assert [e.names for e in export_entries(model)] == [e.names for e in weight_entries(model)]


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_unknown_target_modules_and_a_tied_target_are_refused_naming_the_agent():
    with pytest.raises(ValueError, match="agent 'a'.*no_such_proj"):
        _apply(_llama(), _agent(target_modules="no_such_proj"))
    torch.manual_seed(0)
    tied = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        tie_word_embeddings=True))
    with pytest.raises(ValueError, match="agent 'a'.*tied weight.*lm_head"):
        _apply(tied, _agent(target_modules="lm_head"))


def test_tied_model_exports_the_tie_under_both_names():
    torch.manual_seed(0)
    tied = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        tie_word_embeddings=True))
    expected = [e.names for e in weight_entries(tied)]  # the base model's tensors with all their names
    assert ["model.embed_tokens.weight", "lm_head.weight"] in expected
    entries = merged_entries(_apply(tied, _agent()))
    assert [e.names for e in entries] == expected
    assert any(e.names == ["model.embed_tokens.weight", "lm_head.weight"] and not e.deltas for e in entries)


@pytest.mark.parametrize("setting, value, rule", [
    ("lora_rank", -1, ">= 0"), ("lora_alpha", 0, "> 0"), ("lora_dropout", 1.0, "< 1"),
    ("target_modules", " , ", "at least one"),
])
def test_lora_fields_are_validated_per_agent_and_run_wide(setting, value, rule):
    with pytest.raises(ValueError, match=f"{setting}.*{rule}"):
        _agent(**{setting: value})
    with pytest.raises(ValueError, match=f"--{setting}.*{rule}"):
        TrainConfig.of(agents=[AgentConfig(name="a", pretrain="p")], prompt_data="d", **{setting: value})


def test_agents_inherit_the_run_wide_lora_settings_unless_they_set_their_own():
    cfg = TrainConfig.of(agents=[AgentConfig(name="full", pretrain="p", lora_rank=0),
                              AgentConfig(name="lora", pretrain="p", lora_alpha=32)],
                      prompt_data="d", lora_rank=8, lora_dropout=0.1, target_modules="q_proj,v_proj")
    full, lora = cfg.resolved_agents
    assert (full.lora_rank, full.lora_alpha) == (0, 16)
    assert (lora.lora_rank, lora.lora_alpha, lora.lora_dropout, lora.target_modules) == (8, 32, 0.1, "q_proj,v_proj")
    # the plans carry the resolved adapters: the LoRA agent's adapter, no reference model of its own with a KL term
    full_plan, lora_plan = plan_agents(cfg, on_gpu=False)
    assert full_plan.lora == LoraPlan(0, 16, 0.1, "q_proj,v_proj") and not full_plan.lora.enabled
    assert lora_plan.lora == LoraPlan(8, 32, 0.1, "q_proj,v_proj") and lora_plan.lora.enabled
    assert cfg.algo.loss.uses_kl and full_plan.has_reference and not lora_plan.has_reference
    assert lora_plan.adapter_reference and not full_plan.adapter_reference
