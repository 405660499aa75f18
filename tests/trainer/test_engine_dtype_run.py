"""``--engine_dtype bfloat16`` beside fp32 learners (``--rollout_backend hf_engine``): the engine loads and receives
its weights in bf16, so its log-probs of the sampled tokens differ from the learner's fp32 ones by bf16's rounding,
far above the fp32 engines' gap (about 2e-7 per token, tests/trainer/test_mismatch_alarm.py) and above the fp32
alarm; the alarm is off by default for such an agent, so the run trains on. Ray: the cluster of
tests/trainer/conftest.py."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.utils.jsonl import read_records

pytestmark = pytest.mark.e2e


def test_bf16_engines_beside_fp32_learners_show_their_rounding(ray_cluster, tmp_path, tiny_agents, base_args):
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.config import MISMATCH_ALARM

    out = tmp_path / "run"
    run(base_args(out, "--agent", f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "8",
                  "--no_save_hf", "--no_final_checkpoint", "--rollout_backend", "hf_engine", "--max_steps", "2",
                  "--engine_dtype", "bfloat16"))
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]  # the default alarm did not stop it
    for r in records:
        # bf16 keeps 8 bits of mantissa (measured here: about 5e-4 per token, 2,500 times the fp32 engines' gap)
        assert r["mismatch/mean_abs"] > 2 * MISMATCH_ALARM, r["mismatch/mean_abs"]
        assert r["mismatch/max_abs"] < 1.0, r["mismatch/max_abs"]  # rounding, not other weights
