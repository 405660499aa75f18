"""Preflight rules that depend on the attention dtype and on flash-attn actually importing.

* vLLM 0.32 on CUDA: FlashAttention runs fp16/bf16 with head sizes that are multiples of 8 up to 256; Triton runs
  fp16/bf16/fp32 with head sizes >= 32. So fp32 attention needs heads of 32 or more; bf16 also takes 8, 16, 24.
* flash-attn built against another torch is installed but raises on import: the agents must fall back to sdpa.
"""
from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.trainer.preflight import check_vllm_compatibility, resolve_attention, vllm_head_sizes


def _cfg(agents, **kw) -> TrainConfig:
    defaults = dict(prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=2, n_samples_per_prompt=2,
                    train_batch_size=4, micro_train_batch_size=1, prompt_max_len=64, generate_max_len=32)
    defaults.update(kw)
    return TrainConfig.of(agents=agents, **defaults)


def _config(head_dim):
    return SimpleNamespace(head_dim=head_dim, hidden_size=2 * head_dim, num_attention_heads=2,
                           max_position_embeddings=4096)


# (head size, bf16 supported, fp32 supported) on CUDA, from the two backends' rules by hand
CUDA_TABLE = [(8, True, False), (16, True, False), (20, False, False), (24, True, False), (30, False, False),
              (32, True, True), (40, True, True), (36, True, True), (256, True, True), (264, True, True),
              (512, True, True)]


@pytest.mark.parametrize("head, bf16_ok, fp32_ok", CUDA_TABLE)
def test_cuda_head_sizes_by_dtype(head, bf16_ok, fp32_ok):
    assert vllm_head_sizes("cuda", torch.bfloat16)(head) is bf16_ok
    assert vllm_head_sizes("cuda", torch.float16)(head) is bf16_ok
    assert vllm_head_sizes("cuda", torch.float32)(head) is fp32_ok


def test_fp32_agent_with_small_heads_is_refused_on_cuda_and_bf16_is_not():
    fp32 = _cfg([AgentConfig(name="tiny", pretrain="/models/tiny")])
    with pytest.raises(ValueError, match=r"agent 'tiny': head size 16 .* cuda attention backend \(supported in "
                                         r"float32: Triton: >= 32 in any dtype \(FlashAttention does not run "
                                         r"float32\)\); use --rollout_backend hf for this run or --engine_dtype "
                                         r"bfloat16"):
        check_vllm_compatibility(fp32, {"tiny": _config(16)}, "cuda")
    check_vllm_compatibility(fp32, {"tiny": _config(32)}, "cuda")
    # the engines' precision decides, not the policy's: fp32 learners beside bf16 engines pass
    bf16_engines = _cfg([AgentConfig(name="tiny", pretrain="/models/tiny", engine_dtype="bfloat16")])
    check_vllm_compatibility(bf16_engines, {"tiny": _config(16)}, "cuda")
    bf16 = _cfg([AgentConfig(name="tiny", pretrain="/models/tiny", bf16=True)])
    check_vllm_compatibility(bf16, {"tiny": _config(16)}, "cuda")
    with pytest.raises(ValueError, match=r"head size 20 .* \(supported in bfloat16: FlashAttention: a multiple of 8 "
                                         r"up to 256 in fp16/bf16; Triton: >= 32"):
        check_vllm_compatibility(bf16, {"tiny": _config(20)}, "cuda")


def _stand_in_flash_attn(root, body: str) -> None:
    package = root / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text(body)


@pytest.fixture
def flash_attn_path(tmp_path, monkeypatch):
    """A folder first on sys.path for a stand-in flash_attn package (no real one is imported meanwhile)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    yield tmp_path
    sys.modules.pop("flash_attn", None)


def test_a_flash_attn_that_fails_to_import_falls_back_to_sdpa(flash_attn_path, caplog):
    _stand_in_flash_attn(flash_attn_path, "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    cfg = _cfg([AgentConfig(name="a", pretrain="/models/a")], attn_implementation="flash_attention_2")
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
        assert resolve_attention(cfg) == ["a"]
    assert cfg.resolved_agents[0].attn_implementation == "sdpa"
    assert "undefined symbol" in caplog.text and "ImportError" in caplog.text


def test_a_flash_attn_that_imports_is_kept(flash_attn_path):
    _stand_in_flash_attn(flash_attn_path, "__version__ = '2.8.3'\n")
    cfg = _cfg([AgentConfig(name="a", pretrain="/models/a")], attn_implementation="flash_attention_2")
    assert resolve_attention(cfg) == []
    assert cfg.resolved_agents[0].attn_implementation == "flash_attention_2"
