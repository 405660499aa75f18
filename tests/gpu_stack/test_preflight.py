"""Preflight: GPU counts against the cluster, agents' architectures against the vLLM backend, flash-attn fallback
and hub-id resolution; every error names the agent and the values that would work."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.trainer.preflight import (
    GpuDemand,
    check_gpu_count,
    check_vllm_compatibility,
    gpu_demand,
    resolve_attention,
    resolve_hub_models,
)


def _cfg(agents, **kw) -> TrainConfig:
    defaults = dict(prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=2, n_samples_per_prompt=2,
                    train_batch_size=4, micro_train_batch_size=1, prompt_max_len=64, generate_max_len=32)
    defaults.update(kw)
    return TrainConfig.of(agents=agents, **defaults)


def _plans(cfg: TrainConfig):
    """The agents' GPU plans, as the driver makes them."""
    return plan_agents(cfg, on_gpu=True)


def _agent(name, **kw) -> AgentConfig:
    return AgentConfig(name=name, pretrain=f"/models/{name}", **kw)


def test_three_four_gpu_agents_do_not_fit_eight_gpus():
    cfg = _cfg([_agent("a", dp_size=2, vllm_num_engines=2), _agent("b", dp_size=2, vllm_num_engines=1,
               vllm_tensor_parallel_size=2), _agent("c", dp_size=4, vllm_num_engines=0)], rollout_backend="hf")
    assert gpu_demand(_plans(cfg)) == [GpuDemand("a", 2, 0), GpuDemand("b", 2, 0), GpuDemand("c", 4, 0)]
    cfg.rollout.rollout_backend = "vllm"
    cfg.agents[2] = _agent("c", dp_size=2, vllm_num_engines=2)
    cfg.validate()  # the agents resolved again
    assert gpu_demand(_plans(cfg)) == [GpuDemand("a", 2, 2), GpuDemand("b", 2, 2), GpuDemand("c", 2, 2)]
    each = r"4 \(2 policy \+ 2 vLLM\)"
    with pytest.raises(ValueError, match=rf"need 12 GPUs \(dedicated engine GPUs\): 'a' {each}, 'b' {each}, "
                                         rf"'c' {each}; the Ray cluster has 8"):
        check_gpu_count(_plans(cfg), 8.0)
    check_gpu_count(_plans(cfg), 12.0)


def test_colocated_agents_need_the_larger_of_policy_and_engine_gpus():
    cfg = _cfg([_agent("a", dp_size=2, vllm_num_engines=2, vllm_tensor_parallel_size=2), _agent("b", dp_size=4)],
               colocate_all_models=True, vllm_num_engines=1)
    assert [d.total for d in gpu_demand(_plans(cfg))] == [4, 4]
    check_gpu_count(_plans(cfg), 8.0)
    with pytest.raises(ValueError, match="need 8 GPUs .colocated."):
        check_gpu_count(_plans(cfg), 7.0)


def _config(head_dim=32, max_position_embeddings=128):
    return SimpleNamespace(head_dim=head_dim, hidden_size=2 * head_dim, num_attention_heads=2,
                           max_position_embeddings=max_position_embeddings)


def test_unsupported_head_size_names_the_agent_and_the_supported_sizes():
    cfg = _cfg([_agent("good"), _agent("odd")], bf16=True)
    with pytest.raises(ValueError, match=r"agent 'odd': head size 24 .* vLLM's cpu attention backend \(supported: "
                                         r"one of 32, 64, 80"):
        check_vllm_compatibility(cfg, {"good": _config(32), "odd": _config(24)}, "cpu")
    check_vllm_compatibility(cfg, {"good": _config(32), "odd": _config(24)}, "cuda")  # FlashAttention: 24 % 8 == 0
    with pytest.raises(ValueError, match="agent 'odd': head size 20 .*cuda"):
        check_vllm_compatibility(cfg, {"good": _config(32), "odd": _config(20)}, "cuda")


def test_head_size_from_hidden_size_and_context_length():
    cfg = _cfg([_agent("short")])
    no_head_dim = SimpleNamespace(hidden_size=48, num_attention_heads=2, max_position_embeddings=128)
    with pytest.raises(ValueError, match="head size 24"):
        check_vllm_compatibility(cfg, {"short": no_head_dim}, "cpu")
    with pytest.raises(ValueError, match=r"agent 'short': the engines' context, .* = 96, exceeds the model's "
                                         r"max_position_embeddings = 80"):
        check_vllm_compatibility(cfg, {"short": _config(32, 80)}, "cpu")


def test_flash_attention_falls_back_to_sdpa_without_flash_attn():
    cfg = _cfg([_agent("a", attn_implementation="flash_attention_2"), _agent("b")],
               attn_implementation="flash_attention_2")
    assert resolve_attention(cfg, flash_attn_available=True) == []
    assert resolve_attention(cfg, flash_attn_available=False) == ["a", "b"]
    assert [a.attn_implementation for a in cfg.resolved_agents] == ["sdpa", "sdpa"]


def test_hub_ids_are_downloaded_for_the_vllm_backend(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    cfg = _cfg([AgentConfig(name="hub", pretrain="Qwen/Qwen3-1.7B"), AgentConfig(name="mine", pretrain=str(local))])
    calls = []

    def download(repo_id):
        calls.append(repo_id)
        return str(tmp_path / "snapshots" / repo_id.replace("/", "--"))

    assert resolve_hub_models(cfg, download) == {"hub": str(tmp_path / "snapshots" / "Qwen--Qwen3-1.7B")}
    assert calls == ["Qwen/Qwen3-1.7B"]
    assert cfg.agents[0].pretrain.endswith("Qwen--Qwen3-1.7B") and cfg.agents[1].pretrain == str(local)
    assert resolve_hub_models(_cfg([AgentConfig(name="hf", pretrain="a/b")], rollout_backend="hf"), download) == {}


def test_unreachable_hub_says_what_to_set():
    def offline(repo_id):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    cfg = _cfg([AgentConfig(name="hub", pretrain="meta-llama/Llama-3.2-3B-Instruct")])
    with pytest.raises(FileNotFoundError, match=r"agent 'hub': the vllm backend needs a local model folder and "
                                                r"'meta-llama/Llama-3.2-3B-Instruct' could not be downloaded .*OSError"
                                                r".*set pretrain=DIR"):
        resolve_hub_models(cfg, offline)


def test_rope_scaled_models_are_not_held_to_max_position_embeddings():
    cfg = _cfg([_agent("long")])
    scaled = _config(32, 80)
    scaled.rope_scaling = {"rope_type": "yarn", "factor": 4.0}
    check_vllm_compatibility(cfg, {"long": scaled}, "cpu")
    scaled.rope_scaling = {"rope_type": "default"}
    with pytest.raises(ValueError, match="exceeds"):
        check_vllm_compatibility(cfg, {"long": scaled}, "cpu")


def test_context_check_covers_longer_evaluation_responses():
    cfg = _cfg([_agent("a")], eval_generate_max_len=100)
    with pytest.raises(ValueError, match="= 164, exceeds the model's max_position_embeddings = 128"):
        check_vllm_compatibility(cfg, {"a": _config(32, 128)}, "cpu")
