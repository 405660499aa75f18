"""A checkpoint saved before the config had sections still resumes: the settings of a real 2-step run of the tiny
main job at commit 58967b6 (``tests/testdata/checkpoint_58967b6``, its README says how it was made) pass
``--resume``'s settings check with today's config built from the same command, and a changed setting is still
refused by name."""
from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint
from openrlhf_hacpo.trainer.run_checkpoints import check_resume_settings
from openrlhf_hacpo.utils.errors import CheckpointError

FIXTURE = Path(__file__).resolve().parents[1] / "testdata" / "checkpoint_58967b6"
CHECKPOINT = Path("/tmp/ckpt58967b6-run/checkpoints/global_step2")  # where it was written (named in errors only)


def _read(name: str) -> bytes:
    data = (FIXTURE / name).read_bytes()
    sums = dict(reversed(line.split()) for line in (FIXTURE / "SHA256SUMS").read_text().splitlines())
    assert hashlib.sha256(data).hexdigest() == sums[name], f"{name} differs from SHA256SUMS"
    return data


def _trainer_argv() -> list[str]:
    """The trainer flags of the run's ``train_command.sh`` (after ``-m openrlhf_hacpo.cli.train_hacpo``)."""
    (line,) = [line for line in _read("train_command.sh").decode().splitlines() if "train_hacpo" in line]
    words = shlex.split(line)
    return words[words.index("openrlhf_hacpo.cli.train_hacpo") + 1:]


STATE = json.loads(_read("trainer_state.json"))


def test_the_fixture_is_the_run_it_says():
    assert (STATE["step"], STATE["agents"], STATE["algorithm"], STATE["seed"]) == (2, ["llamaS", "qwenM"], "hacpo", 0)
    assert json.loads(_read("tiny_run.json"))["extra_args"] == ["--save_steps", "1", "--eval_max_samples", "8"]


def test_the_saved_settings_pass_the_resume_check():
    cfg = build_config(_trainer_argv() + ["--resume"])
    assert cfg.agent_names == STATE["agents"]
    fingerprint = config_fingerprint(cfg)
    assert fingerprint == STATE["fingerprint"]  # every key and value as the flat config wrote them
    assert check_resume_settings(CHECKPOINT, STATE, fingerprint, accept_mismatch=False) == []


@pytest.mark.parametrize("flags, difference", [
    (["--seed", "1"], "seed: checkpoint 0, this run 1"),
    (["--top_p", "0.9"], "top_p: checkpoint 1.0, this run 0.9"),
    (["--cross_clip_delta", "0.3"], "algo.loss.delta: checkpoint 0.2, this run 0.3"),
    (["--actor_learning_rate", "1e-4"], "agent.llamaS.learning_rate: checkpoint 0.0003, this run 0.0001"),
])
def test_a_changed_setting_is_refused_by_name(flags, difference):
    cfg = build_config(_trainer_argv() + ["--resume", *flags])
    with pytest.raises(CheckpointError, match="was written with other settings") as err:
        check_resume_settings(CHECKPOINT, STATE, config_fingerprint(cfg), cfg.outputs.resume_accept_mismatch)
    assert difference in str(err.value)
    accepted = build_config(_trainer_argv() + ["--resume", "--resume_accept_mismatch", *flags])
    assert difference in check_resume_settings(CHECKPOINT, STATE, config_fingerprint(accepted),
                                               accepted.outputs.resume_accept_mismatch)
