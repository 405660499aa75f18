"""A broken weight sync is named: with ``--rollout_backend hf_engine`` and a sync that withholds one tensor from the
engine (the engine keeps its old value: the driver's ``AgentGroup.sync_weights`` is wrapped to put it back inside the
engine actor, ``__ray_call__``), the run stops at the next step's rollouts, before any update on them, with an error
that names the agent, the backend and the measured gap against ``--mismatch_alarm``; the step before it, synced
correctly (the engine's initial weights), logs its mismatch/* figures below the threshold. Ray: the cluster of
tests/trainer/conftest.py."""
from __future__ import annotations

import re

import pytest

from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = pytest.mark.e2e

WITHHELD = "model.layers.0.mlp.down_proj.weight"


def test_a_sync_that_withholds_a_tensor_stops_the_next_step(ray_cluster, tmp_path, tiny_agents, base_args,
                                                            monkeypatch):
    import ray

    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.config import MISMATCH_ALARM
    from openrlhf_hacpo.trainer.failures import TrainingError

    def keep(engine_actor, name):
        """Inside the engine actor (``__ray_call__``; defined here so that Ray ships it by value): a copy of the
        model's tensor ``name``."""
        return engine_actor.engine.model.state_dict()[name].detach().clone()

    def restore(engine_actor, name, value):
        """Inside the engine actor: put ``value`` back into the model's tensor ``name`` (the sync withheld it)."""
        import torch

        with torch.no_grad():
            engine_actor.engine.model.state_dict()[name].copy_(value)

    real_sync = AgentGroup.sync_weights

    def broken_sync(group):
        if not group.engines:
            return real_sync(group)
        kept = [ray.get(e.__ray_call__.remote(keep, WITHHELD)) for e in group.engines]
        seconds = real_sync(group)
        ray.get([e.__ray_call__.remote(restore, WITHHELD, v) for e, v in zip(group.engines, kept)])
        return seconds

    monkeypatch.setattr(AgentGroup, "sync_weights", broken_sync)
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
    import ray

    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.trainer.failures import TrainingError

    def keep_all(engine_actor):
        """Inside the engine actor: a copy of every tensor of the model."""
        return {k: v.detach().clone() for k, v in engine_actor.engine.model.state_dict().items()}

    def restore_all(engine_actor, values):
        import torch

        with torch.no_grad():
            for name, tensor in engine_actor.engine.model.state_dict().items():
                tensor.copy_(values[name])

    real_sync = AgentGroup.sync_weights
    base: dict = {}

    def unmerged_sync(group):
        if not base:  # before the first sync: the engines hold the base model
            base.update({i: ray.get(e.__ray_call__.remote(keep_all)) for i, e in enumerate(group.engines)})
        seconds = real_sync(group)
        ray.get([e.__ray_call__.remote(restore_all, base[i]) for i, e in enumerate(group.engines)])
        return seconds

    monkeypatch.setattr(AgentGroup, "sync_weights", unmerged_sync)
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']},lora_rank=4,lora_alpha=16",
                      "--train_batch_size", "8", "--no_save_hf", "--no_final_checkpoint",
                      "--rollout_backend", "hf_engine", "--max_steps", "3"))
    message = str(err.value)
    assert message.startswith("step 2: agent 'llama', rollout backend hf_engine:"), message
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == [1]
