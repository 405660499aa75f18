"""LoRA agents in whole runs: a LoRA agent beside a full-parameter one through the command line's ``run`` (2 steps,
a checkpoint every step, the KL term on; ``--no_ray``, the policy and reference workers in the test process),
resumed exactly; and, on a local Ray cluster, the adapter-disabled reference of a LoRA agent whose model ZeRO-3
shards over 2 ranks (each rank an actor), against the base model in float64. An adapter synced to vLLM engine
actors: tests/engines/test_lora_sync.py."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("peft")
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

LORA_RANK, LORA_ALPHA = 4, 16


def _load(path, dtype=torch.float64):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _max_diff(a, b) -> float:
    pb = dict(b.named_parameters())
    return max(float((p.detach() - pb[n].detach()).abs().max()) for n, p in a.named_parameters())


def _lora_count(model) -> int:
    """rank x (in + out) of every linear layer of the decoder blocks (peft's all-linear: not the head)."""
    layers = [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in name]
    return sum(LORA_RANK * (m.in_features + m.out_features) for m in layers)


def test_lora_and_full_parameter_agents_train_through_the_cli_and_resume_exactly(tmp_path, tiny_agents, base_args):
    """llama trains a LoRA adapter (its reference: its own model with the adapter off), qwen all its parameters
    (its reference: a reference worker). Both learn, the exports hold the merged weights and the adapter, and a run
    resumed from the step-1 checkpoint repeats step 2: the same metrics and the same exported weights."""
    from safetensors.torch import load_file

    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.utils.jsonl import read_records

    common = ["--agent", f"name=llama,pretrain={tiny_agents['llama']},lora_rank={LORA_RANK},lora_alpha={LORA_ALPHA}",
              "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}", "--train_batch_size", "16",
              "--max_steps", "2", "--save_steps", "1", "--init_kl_coef", "0.01", "--actor_learning_rate", "0.01",
              "--no_ray"]
    straight = tmp_path / "straight"
    controller = run(base_args(straight, *common))
    assert [g.reference is None for g in controller.groups] == [True, False]  # no reference worker for LoRA

    records = read_records(straight / "metrics.jsonl")
    assert [(r["step"], r["agent"]) for r in records] == [(1, "llama"), (1, "qwen"), (2, "llama"), (2, "qwen")]
    for rec in records:
        assert rec["updates"] == 1 and rec["skipped_updates"] == 0
    # step 2 scores against the reference after one update: the KL is positive for both kinds of reference
    assert all(r["policy/kl"] > 0 for r in records if r["step"] == 2)

    # the LoRA export: a merged model that moved, and the adapter alone (B A of every linear layer)
    base = _load(tiny_agents["llama"])
    merged = _load(straight / "hf" / "llama")
    assert _max_diff(merged, base) > 1e-4
    adapter = load_file(str(straight / "hf" / "llama" / "adapter" / "adapter_model.safetensors"))
    assert sum(t.numel() for t in adapter.values()) == _lora_count(base)
    assert not (straight / "hf" / "qwen" / "adapter").exists()
    assert _max_diff(_load(straight / "hf" / "qwen"), _load(tiny_agents["qwen"])) > 1e-4

    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "checkpoints" / "global_step1", resumed / "checkpoints" / "global_step1")
    (resumed / "checkpoints" / "latest").write_text("global_step1\n")
    run(base_args(resumed, *common, "--resume"))
    a = {(r["step"], r["agent"]): r for r in records}
    b = {(r["step"], r["agent"]): r for r in read_records(resumed / "metrics.jsonl")}
    assert sorted(b) == [(2, "llama"), (2, "qwen")]
    for key, rec in b.items():
        compared = 0
        for name, value in rec.items():
            if name.startswith(("time/", "rollout/tokens_per_s")) or not isinstance(value, float):
                continue
            assert value == pytest.approx(a[key][name], rel=1e-5, abs=1e-6), (key, name)
            compared += 1
        assert compared > 30
    for name in ("llama", "qwen"):
        assert _max_diff(_load(resumed / "hf" / name), _load(straight / "hf" / name)) < 1e-6
    again = load_file(str(resumed / "hf" / "llama" / "adapter" / "adapter_model.safetensors"))
    assert max(float((again[k] - adapter[k]).abs().max()) for k in adapter) < 1e-6
    state = json.loads((resumed / "checkpoints" / "global_step2" / "trainer_state.json").read_text())
    assert state["step"] == 2


@torch.no_grad()
def _base_logprobs(model, prompt, response) -> list[float]:
    """float64 log softmax of the response tokens given the prompt, one unpadded row (independent of the trainer)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


def test_zero3_two_rank_lora_reference_is_the_base_model(ray_cluster, tmp_path, tiny_agents, base_args):
    """A LoRA agent on ZeRO-3 over 2 ranks after one update with a large learning rate: each rank scores its own
    rows (different rows, the same count, so the ranks' layer gathers stay in step). The reference (adapter
    disabled) equals the base model's float64 log-probs within 2e-5 (float32 training), while the adapted policy
    differs from them by more than 1e-3."""
    import ray

    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.controller import HACPOController

    cfg = build_config(base_args(
        tmp_path, "--agent", f"name=llama,pretrain={tiny_agents['llama']},dp_size=2,zero_stage=3,"
        f"lora_rank={LORA_RANK},lora_alpha={LORA_ALPHA}", "--algorithm", "gspo", "--train_batch_size", "8",
        "--micro_train_batch_size", "2", "--max_steps", "1", "--init_kl_coef", "0.01",
        "--actor_learning_rate", "0.05", "--lr_scheduler", "constant", "--no_save_hf", "--no_final_checkpoint"))
    prompts = [[1, 20, 5, 9], [1, 4, 4, 7, 12], [1, 13, 6], [1, 7, 8], [1, 9, 9, 9, 2, 3], [1, 11]]
    responses = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 3], [6, 6, 6, 6, 6], [2]]
    shares = [(prompts[:3], responses[:3]), (prompts[3:], responses[3:])]

    def score_on_rank(worker, prompts, responses):
        """Inside a policy rank (``__ray_call__``; defined here so that Ray ships it by value): the reference's
        log-probs (adapter off) and the adapted policy's. Every rank calls it at once (ZeRO-3 gathers collectively)."""
        from openrlhf_hacpo.models import score_logprobs

        reference = worker.updater.reference.compute_logprobs(prompts, responses, 1.0)
        worker.model.eval()
        try:
            adapted = score_logprobs(worker.model, prompts, responses, worker.pad_token_id, 1.0, 4, worker.device,
                                     path="logits", backend="torch")
        finally:
            worker.model.train()
        return [r.tolist() for r in reference], [r.tolist() for r in adapted], type(worker.updater.reference).__name__

    controller = HACPOController(cfg)
    try:
        controller.fit()
        (group,) = controller.groups
        assert group.reference is None and len(group.policies) == 2
        scored = ray.get([p.__ray_call__.remote(score_on_rank, *share) for p, share in zip(group.policies, shares)])
    finally:
        controller.close()
    assert {kind for _, _, kind in scored} == {"AdapterDisabledReference"}
    base = _load(tiny_agents["llama"])
    worst_reference, moved = 0.0, 0.0
    for (share_prompts, share_responses), (reference, adapted, _) in zip(shares, scored):
        for prompt, response, ref_row, adapted_row in zip(share_prompts, share_responses, reference, adapted):
            expected = torch.tensor(_base_logprobs(base, prompt, response))
            worst_reference = max(worst_reference, float((torch.tensor(ref_row, dtype=torch.float64)
                                                          - expected).abs().max()))
            moved = max(moved, float((torch.tensor(adapted_row, dtype=torch.float64) - expected).abs().max()))
    assert worst_reference < 2e-5
    assert moved > 1e-3
