"""Fixtures of the fault-injection suite: one tiny Llama agent, eight chat-form prompts, a reward file, and the flags
of a tiny ``--no_ray`` run (nothing is downloaded; models are built in a temp folder)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fault_inputs import PARITY_REWARD, write_file

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """Model folder of a 2-layer Llama with the zoo's character tokenizer."""
    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    tokenizer = build_tokenizer("char")
    spec = ModelSpec(family="llama", hidden_size=32, num_layers=2, num_heads=2, head_dim=32, num_kv_heads=1,
                     intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("agents") / "llama"
    build_model(spec, tokenizer, seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def chat_prompts(tmp_path_factory) -> str:
    """Eight chat-form arithmetic prompts (``input`` / ``label``)."""
    from openrlhf_hacpo.data.arithmetic import Problem, to_record

    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    problems = [Problem(1, (a, b)) for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (6, 3), (4, 4), (8, 0)]]
    path.write_text("".join(json.dumps(to_record(p, f"p{i}")) + "\n" for i, p in enumerate(problems)))
    return str(path)


@pytest.fixture(scope="session")
def parity_reward(tmp_path_factory) -> str:
    return write_file(tmp_path_factory.mktemp("reward"), "parity.py", PARITY_REWARD)


@pytest.fixture
def run_args(tiny_llama, chat_prompts, parity_reward):
    """Flags of a tiny one-agent ``--no_ray`` run (2 prompts × G=4 per step, so 4 steps per episode)."""

    def make(save_path, *extra: str) -> list[str]:
        return ["--agent", f"name=llama,pretrain={tiny_llama}", "--prompt_data", chat_prompts,
                "--apply_chat_template", "--reward_fn", parity_reward, "--reward_num_workers", "0",
                "--n_samples_per_prompt", "4", "--rollout_batch_size", "2", "--train_batch_size", "8",
                "--micro_train_batch_size", "4", "--generate_max_len", "8", "--prompt_max_len", "64",
                "--init_kl_coef", "0", "--seed", "7", "--no_ray", "--no_progress_bar", "--no_save_hf",
                "--save_path", str(save_path), *extra]

    return make
