"""A broken weight sync is named: with ``--rollout_backend hf_engine`` and a sync that withholds one tensor from the
engine (the engine keeps its old value: tests/trainer/broken_sync.py), the run stops at the next step's rollouts,
before any update on them, with an error that names the agent, the backend and the measured gap against
``--mismatch_alarm``; the step before it, synced correctly (the engine's initial weights), logs its mismatch/*
figures below the threshold. Ray: the cluster of tests/trainer/conftest.py."""
from __future__ import annotations

import re

import pytest

from broken_sync import engines_keep_their_weights

from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = pytest.mark.e2e

WITHHELD = "model.layers.0.mlp.down_proj.weight"


def test_a_sync_that_withholds_a_tensor_stops_the_next_step(ray_cluster, tmp_path, tiny_agents, base_args,
                                                            monkeypatch):
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.config import MISMATCH_ALARM
    from openrlhf_hacpo.trainer.failures import TrainingError

    engines_keep_their_weights(monkeypatch, [WITHHELD])
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "8",
                      "--no_save_hf", "--no_final_checkpoint", "--rollout_backend", "hf_engine", "--max_steps", "3"))
    message = str(err.value)
    assert message.startswith("step 2: agent 'llama', rollout backend hf_engine:"), message
    assert "weight sync after step 1" in message
    gap = float(re.search(r"per token (\S+) > --mismatch_alarm (\S+)", message).group(1))
    assert gap > MISMATCH_ALARM and f"--mismatch_alarm {MISMATCH_ALARM:.3g}" in message
    assert err.value.agent == "llama"
    # step 1 (the engine's initial weights) passed the check and was logged; step 2 never trained
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]
    assert 0 <= records[0]["mismatch/mean_abs"] < MISMATCH_ALARM < gap
    assert {"mismatch/max_abs", "mismatch/k3_kl", "mismatch/seq_log_ratio_mean", "mismatch/seq_log_ratio_std",
            "mismatch/ppl_ratio"} <= set(records[0])


def test_a_lora_adapter_that_never_reaches_the_engine_stops_the_next_step(ray_cluster, tmp_path, tiny_agents,
                                                                          base_args, monkeypatch):
    """A LoRA agent (``lora_rank`` 4) whose engine never gets the adapter: after every sync the engine's weights are
    put back to the base model's (its state at the first sync, when the adapter's B = 0 makes the merged weights the
    base ones), which is what an export that leaves the adapter unmerged sends. The first update moves the adapter,
    so the step after it is named."""
    pytest.importorskip("peft")
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.trainer.failures import TrainingError

    engines_keep_their_weights(monkeypatch)  # every tensor: the base model's, no adapter merged in
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']},lora_rank=4,lora_alpha=16",
                      "--train_batch_size", "8", "--no_save_hf", "--no_final_checkpoint",
                      "--rollout_backend", "hf_engine", "--max_steps", "3"))
    message = str(err.value)
    assert message.startswith("step 2: agent 'llama', rollout backend hf_engine:"), message
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == [1]
