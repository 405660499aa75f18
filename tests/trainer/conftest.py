"""Tiny heterogeneous agents and prompt data for the trainer tests (built in a temp folder; no downloads).

* ``llama``: Llama architecture with the zoo's character tokenizer (``<s>`` + message + ``"\\nA: "`` template).
* ``qwen``: Qwen3 architecture with the zoo's byte-level BPE tokenizer (ChatML template).
* ``llama2``: a second Llama with other initial weights (three-agent runs).

Rewards come from a reward file (OpenRLHF style) that scores a response by the parity of its length, so random
models get mixed rewards and non-zero advantages.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

REWARD_FILE = '''
def reward_func(queries, prompts, labels):
    """1.0 when the response (query minus prompt) has an even number of characters."""
    return [float((len(q) - len(p)) % 2 == 0) for q, p in zip(queries, prompts)]
'''


def _save_agent(root: Path, name: str, family: str, tokenizer_kind: str, seed: int) -> str:
    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(tokenizer_kind)
    # head_dim 32: vLLM's CPU attention supports head sizes >= 32
    spec = ModelSpec(family=family, hidden_size=32, num_layers=2, num_heads=2, head_dim=32, num_kv_heads=1,
                     intermediate_size=64, max_position_embeddings=128)
    model = build_model(spec, tokenizer, seed=seed)
    path = root / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_agents(tmp_path_factory) -> dict[str, str]:
    """Model folders of the tiny agents, by name."""
    root = tmp_path_factory.mktemp("agents")
    return {
        "llama": _save_agent(root, "llama", "llama", "char", seed=1),
        "qwen": _save_agent(root, "qwen", "qwen3", "bpe", seed=2),
        "llama2": _save_agent(root, "llama2", "llama", "char", seed=3),
    }


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory) -> str:
    """Eight chat-form arithmetic prompts (``input`` / ``label``)."""
    from openrlhf_hacpo.data.arithmetic import Problem, to_record

    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    problems = [Problem(1, (a, b)) for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (6, 3), (4, 4), (8, 0)]]
    path.write_text("".join(json.dumps(to_record(p, f"p{i}")) + "\n" for i, p in enumerate(problems)))
    return str(path)


@pytest.fixture(scope="session")
def reward_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reward") / "parity_reward.py"
    path.write_text(REWARD_FILE)
    return str(path)


@pytest.fixture(scope="session")
def base_args(prompt_file, reward_file):
    """Shared CLI flags of a tiny run: 2 prompts x G=4 per step, 8-token responses, fp32, ZeRO-2."""

    def make(save_path, *extra: str) -> list[str]:
        return [
            "--prompt_data", prompt_file, "--apply_chat_template",
            "--reward_fn", reward_file, "--reward_num_workers", "0",
            "--n_samples_per_prompt", "4", "--rollout_batch_size", "2",
            "--generate_max_len", "8", "--prompt_max_len", "64",
            "--micro_train_batch_size", "4",
            "--actor_learning_rate", "1e-3", "--l2", "0.0",
            "--init_kl_coef", "0", "--seed", "7",
            "--save_path", str(save_path), "--no_progress_bar",
            *extra,
        ]

    return make


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster per test module (2 CPUs; actors ask for no CPU so several agents fit)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                           "TORCH_EXTENSIONS_DIR": os.environ["TORCH_EXTENSIONS_DIR"],
                                           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0")}})
    yield ray
    ray.shutdown()
