"""The training-inference correction in a whole run (``--rollout_is``, ``--rollout_backend hf_engine``, HACPO with two
agents): the engines' log-probs reach every learner's loss, own rows per token and foreign rows per sequence.

Step 1 trains on rollouts of the engines' initial weights, equal to the policies' in fp32, so every weight is 1 up to
float rounding and no unit leaves the mask band. The sync after step 1 then withholds one tensor of llama's engine
(the engine keeps its old value, tests/trainer/broken_sync.py; the alarm is off here), so step 2's
llama rollouts come from other weights than the trainer's: llama's own tokens and, in qwen's batch, llama's rows as
foreign rows carry weights far from 1 and the band masks some of them, while qwen's own rows, synced correctly, stay
at 1. Ray: the cluster of tests/trainer/conftest.py."""
from __future__ import annotations

import pytest

from broken_sync import engines_keep_their_weights

from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = pytest.mark.e2e

WITHHELD = "model.layers.0.mlp.down_proj.weight"
BAND = 2e-5  # mask outside [1 - BAND, 1 + BAND]: above fp32 rounding (max |d| per token ~1e-6), below a withheld
#               tensor's gap (mean |d| per token ~4e-4 with these settings)


def test_the_correction_sees_a_broken_sync_and_nothing_else(ray_cluster, tmp_path, tiny_agents, base_args,
                                                            monkeypatch):
    from openrlhf_hacpo.cli.train_hacpo import run

    engines_keep_their_weights(monkeypatch, [WITHHELD], agent="llama")
    out = tmp_path / "run"
    run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']}",
                  "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}", "--algorithm", "hacpo",
                  "--train_batch_size", "16", "--no_save_hf", "--no_final_checkpoint", "--rollout_backend", "hf_engine",
                  "--max_steps", "2", "--mismatch_alarm", "0",
                  "--rollout_is", "--rollout_is_level", "token", "--rollout_is_mode", "mask",
                  "--rollout_is_threshold", str(1 + BAND), "--rollout_is_threshold_lower", str(1 - BAND)))
    records = {(r["step"], r["agent"]): r for r in read_records(out / "metrics.jsonl")}
    assert set(records) == {(1, "llama"), (1, "qwen"), (2, "llama"), (2, "qwen")}

    def figure(step, agent, name):
        return records[(step, agent)][f"policy/rollout_is_{name}"]

    for agent in ("llama", "qwen"):  # step 1: engines and trainers hold the same weights
        for kind in ("own", "foreign"):
            assert figure(1, agent, f"{kind}_masked_frac") == 0.0, (agent, kind)
            assert figure(1, agent, f"{kind}_weight_mean") == pytest.approx(1.0, abs=BAND), (agent, kind)
        assert records[(1, agent)]["mismatch/max_abs"] < BAND, records[(1, agent)]
    # step 2: llama's engine sampled with a stale tensor
    assert records[(2, "llama")]["mismatch/mean_abs"] > 10 * BAND
    assert figure(2, "llama", "own_masked_frac") > 0.0            # llama's own tokens, per token
    assert figure(2, "qwen", "foreign_masked_frac") > 0.0         # llama's rows in qwen's batch, per sequence
    assert figure(2, "qwen", "own_masked_frac") == 0.0            # qwen's engine was synced
    assert figure(2, "qwen", "own_weight_mean") == pytest.approx(1.0, abs=BAND)
