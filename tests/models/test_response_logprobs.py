"""Response log-probs through the fused LM-head path against float64 full-logit references.

The reference runs the same model in float64 with ``output_hidden_states`` and takes
``log_softmax((h W^T + b) / T)`` of the whole vocabulary at every response position, written out here (not through
the project's kernels). Covered: Llama, Qwen2 and Qwen3, tied and untied heads, a head with a bias, fp32 and bf16,
temperatures, ragged prompt and response lengths, gradients (fused against the full-logits path), gradient
checkpointing, the fallback for heads that are not a plain linear map, and ZeRO-3 with 2 ranks on gloo.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from openrlhf_hacpo.models import response_logprobs
from openrlhf_hacpo.utils.network import free_port
from openrlhf_hacpo.utils.padding import pack_rows

VOCAB = 97
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PROMPTS = [[5, 9, 3], [7], [11, 12, 13, 14, 15], [4, 4]]
RESPONSES = [[20, 21, 22, 23], [30], [40, 41], [50, 51, 52, 53, 54, 55]]


def tiny_model(family: str, tied: bool, bias: bool = False, seed: int = 0) -> torch.nn.Module:
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    config = cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, max_position_embeddings=64, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    if bias:
        head = model.lm_head
        model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
        with torch.no_grad():
            model.lm_head.weight.copy_(head.weight)
            model.lm_head.bias.normal_(0.0, 0.5)
    return model


def padded_batch(device="cpu"):
    return pack_rows(PROMPTS, RESPONSES, 0).to(device)


def reference(model: torch.nn.Module, padded, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 log-probs and entropies of every response position from the full logits."""
    m64 = copy.deepcopy(model).to("cpu", torch.float64)
    padded = padded.to("cpu")
    with torch.no_grad():
        out = m64(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                  position_ids=padded["position_ids"], output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-1]
        head = m64.get_output_embeddings()
        logits = hidden @ head.weight.t() + (head.bias if head.bias is not None else 0.0)
        r = padded["response_ids"].shape[1]
        logits = logits[:, -r - 1:-1] / temperature
        lp = torch.log_softmax(logits, dim=-1)
        logp = lp.gather(-1, padded["response_ids"][..., None])[..., 0]
        entropy = -(lp.exp() * lp).sum(-1)
    mask = padded["response_mask"] > 0
    return torch.where(mask, logp, 0.0), torch.where(mask, entropy, 0.0)


@pytest.mark.parametrize("family,tied,bias", [("llama", True, False), ("llama", False, False),
                                              ("qwen3", False, True), ("qwen3", True, False), ("qwen2", False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_path_matches_float64_full_logits(family, tied, bias, dtype, temperature, device):
    """On CUDA the fused path runs the Triton kernels (backend auto), on CPU the torch twin."""
    model = tiny_model(family, tied, bias)
    padded = padded_batch(device)
    ref_logp, ref_entropy = reference(model, padded, temperature)
    out = response_logprobs(model.to(device, dtype), padded, temperature, with_entropy=True, path="fused")
    # bf16 weights and activations; on CUDA fp32 attention kernels sum in another order
    tol = 3e-2 if dtype == torch.bfloat16 else (1e-5 if device == "cpu" else 1e-4)
    mask = (padded["response_mask"] > 0).cpu()
    logp, entropy = out.logp.cpu(), out.entropy.cpu()
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp[mask].double(), ref_logp[mask], rtol=tol, atol=tol)
    torch.testing.assert_close(entropy[mask].double(), ref_entropy[mask], rtol=tol, atol=tol)
    assert torch.all(logp[~mask] == 0) and torch.all(entropy[~mask] == 0)


@pytest.mark.parametrize("family,tied,bias", [("llama", True, False), ("qwen3", False, True)])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_and_logits_paths_give_the_same_gradients(family, tied, bias, device):
    padded = padded_batch(device)
    weights = torch.randn(padded["response_ids"].shape, dtype=torch.float64, device=device)
    grads = {}
    for path in ("fused", "logits"):
        model = tiny_model(family, tied, bias).to(device)
        out = response_logprobs(model, padded, 0.8, path=path)
        (out.logp.double() * weights).sum().backward()
        grads[path] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for name, g in grads["logits"].items():
        torch.testing.assert_close(grads["fused"][name], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_gradient_checkpointing_does_not_change_the_fused_path():
    padded = padded_batch()
    results = []
    for checkpointing in (False, True):
        model = tiny_model("llama", tied=True)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        out = response_logprobs(model, padded, 1.0, path="fused")
        out.logp.sum().backward()
        results.append((out.logp.detach(), model.model.embed_tokens.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_a_head_that_is_not_a_plain_linear_map_falls_back_to_logits_with_a_notice(caplog):
    model = tiny_model("llama", tied=True)
    model.config.final_logit_softcapping = 30.0
    padded = padded_batch()
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo.models.logprobs"):
        fused = response_logprobs(model, padded, 1.0, path="fused")
    assert any("final_logit_softcapping" in r.getMessage() for r in caplog.records)
    ref_logp, _ = reference(model, padded, 1.0)
    torch.testing.assert_close(fused.logp.double(), ref_logp, rtol=1e-5, atol=1e-5)


def test_bad_path_is_named():
    with pytest.raises(ValueError, match="log-prob path"):
        response_logprobs(tiny_model("llama", True), padded_batch(), 1.0, path="chunked")


ZERO3_SCRIPT = pathlib.Path(__file__).with_name("zero3_logprobs_worker.py")


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_zero3_two_ranks_match_the_unsharded_reference(tmp_path):
    """ZeRO-3 (2 ranks, gloo): the fused path's log-probs equal the float64 reference, and the gradients of the
    head / embedding weight gathered from the shards equal those of the full-logits path."""
    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(ZERO3_SCRIPT),
                           str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    padded = padded_batch()
    ref_logp, _ = reference(tiny_model("qwen3", tied=False, bias=False, seed=3), padded, 0.9)
    mask = padded["response_mask"] > 0
    for path in ("fused", "logits"):
        got = torch.tensor(result[path]["logp"], dtype=torch.float64)
        torch.testing.assert_close(got[mask], ref_logp[mask], rtol=1e-5, atol=1e-5)
    for name in result["fused"]["grads"]:
        fused = torch.tensor(result["fused"]["grads"][name])
        logits = torch.tensor(result["logits"]["grads"][name])
        assert float(logits.norm()) > 0, name
        torch.testing.assert_close(fused, logits, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")

