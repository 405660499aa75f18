"""Flags of a tiny trainer run and one Ray cluster for the folder's tests; the agents, prompts and reward file are the
session fixtures of ``tests/conftest.py``."""
from __future__ import annotations

import os

import pytest
from local_ray import pytest_runtest_teardown, ray_cluster  # noqa: F401  (the folder's one Ray cluster)

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


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


@pytest.fixture(scope="session")
def one_step_llama_run(tmp_path_factory, tiny_agents, base_args, prompt_file):
    """The folder of one finished ``--no_ray`` run, made once per session for the tests that only read it: the llama
    agent, 8 rows, one step, the default final joint checkpoint, no HF export, and 4-token evaluations before
    training and after the step on two files (the prompt file and ``extra.jsonl``, one prompt of data source
    ``extra``). A test that runs more commands in it works on a copy."""
    import json

    from openrlhf_hacpo.cli.train_hacpo import run

    root = tmp_path_factory.mktemp("one_step_llama")
    extra = root / "extra.jsonl"
    extra.write_text(json.dumps({"input": "What is 1 + 1?", "label": "2", "prompt_id": "extra:0"}) + "\n")
    run(base_args(root / "run", "--no_ray", "--agent", f"name=llama,pretrain={tiny_agents['llama']}",
                  "--train_batch_size", "8", "--max_steps", "1", "--no_save_hf",
                  "--eval_data", prompt_file, str(extra), "--eval_before_training", "--eval_generate_max_len", "4"))
    return root / "run"
