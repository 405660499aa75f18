"""``python -m openrlhf_hacpo.cli.memory_plan``: the train_hacpo flags in, the plan's table out, exit 1 with the
refusal when a GPU cannot hold its share (called in-process on a saved ``config.json``, no weights)."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.cli.memory_plan import main


@pytest.fixture(scope="module")
def qwen8b_folder(tmp_path_factory):
    """A folder holding only Qwen3-8B's config (its published sizes)."""
    from transformers import Qwen3Config

    folder = tmp_path_factory.mktemp("qwen3_8b")
    Qwen3Config(vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False,
                max_position_embeddings=40960).save_pretrained(folder)
    return str(folder)


def _flags(folder: str, *extra: str) -> list[str]:
    return ["--agent", f"name=a,pretrain={folder}", "--agent", f"name=b,pretrain={folder},zero_stage=3",
            "--prompt_data", "prompts.jsonl", "--rollout_backend", "vllm", "--vllm_num_engines", "2",
            "--actor_num_gpus_per_node", "2", "--bf16", "--micro_train_batch_size", "4", "--generate_max_len", "8192",
            *extra]


def test_prints_a_table_per_agent_and_gpu(qwen8b_folder, capsys):
    rc = main(_flags(qwen8b_folder, "--gpu_memory_gb", "141", "--gradient_checkpointing", "--zero_stage", "3"))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "GPU size 141.0 GiB" in out and "memory plan: every agent fits" in out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith(("a ", "b "))]
    # each agent: policy GPUs 0-1 (the reference on 0), dedicated engine GPUs 2-3
    assert rows == [[n, str(g), role] for n in "ab" for g, role in enumerate(["policy", "policy", "vLLM", "vLLM"])]


def test_refuses_with_the_options_that_fit(qwen8b_folder, capsys):
    rc = main(_flags(qwen8b_folder, "--gpu_memory_gb", "79.6"))
    out = capsys.readouterr().out
    assert rc == 1
    assert "agent 'a'" in out and "agent 'b'" in out and "79.6 GiB" in out and "options that fit" in out


def test_bad_model_folder_is_named(tmp_path, capsys):
    rc = main(_flags(str(tmp_path / "missing"), "--gpu_memory_gb", "80"))
    assert rc == 2
    assert "memory_plan: error:" in capsys.readouterr().err
