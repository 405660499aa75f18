"""Fixtures of the fault-injection suite: the flags of a tiny one-agent ``--no_ray`` run, on the session's tiny
agents, chat-form prompts and parity reward file (``tests/conftest.py``)."""
from __future__ import annotations

import pytest


@pytest.fixture
def run_args(tiny_agents, prompt_file, reward_file):
    """Flags of a tiny one-agent ``--no_ray`` run (2 prompts × G=4 per step, so 4 steps per episode)."""

    def make(save_path, *extra: str) -> list[str]:
        return ["--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--prompt_data", prompt_file,
                "--apply_chat_template", "--reward_fn", reward_file, "--reward_num_workers", "0",
                "--n_samples_per_prompt", "4", "--rollout_batch_size", "2", "--train_batch_size", "8",
                "--micro_train_batch_size", "4", "--generate_max_len", "8", "--prompt_max_len", "64",
                "--init_kl_coef", "0", "--seed", "7", "--no_ray", "--no_progress_bar", "--no_save_hf",
                "--save_path", str(save_path), *extra]

    return make
