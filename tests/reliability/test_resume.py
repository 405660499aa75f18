"""Resuming: the trainer state is read and checked before any worker starts; a checkpoint written with other
settings is refused with the list of differences unless the run accepts them."""
from __future__ import annotations

import logging

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.trainer.checkpoint import CheckpointManager
from openrlhf_hacpo.utils.rng import capture_rng_state
from openrlhf_hacpo.trainer.controller import HACPOController
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint
from openrlhf_hacpo.utils.errors import CheckpointError, RunFolderError

GEOMETRY = ["--n_samples_per_prompt", "4", "--rollout_batch_size", "2", "--train_batch_size", "8",
            "--micro_train_batch_size", "4"]


def _flags(save_path, *extra: str) -> list[str]:
    return ["--agent", "name=llama,pretrain=/m/llama", "--prompt_data", "x.jsonl", "--save_path", str(save_path),
            *GEOMETRY, *extra]


def _checkpoint_of(cfg) -> None:
    """Step 2 of a run with ``cfg``, as the controller writes it."""
    state = {"step": 2, "agents": cfg.agent_names, "algorithm": cfg.algo.algorithm, "rng": capture_rng_state(False),
             "seed": cfg.train.seed, "fingerprint": config_fingerprint(cfg)}

    def write_agents(tmp):
        CheckpointManager.agent_dir(tmp, "llama").mkdir(parents=True)

    CheckpointManager(cfg.checkpoint_dir).save(2, state, write_agents)


def _refusal(cfg) -> str:
    """The :class:`CheckpointError` a resume with ``cfg`` stops with, before any worker starts."""
    controller = HACPOController(cfg)
    try:
        with pytest.raises(CheckpointError) as info:
            controller.checkpoints.prepare()
    finally:
        controller.close()
    return str(info.value)


def test_resume_with_other_settings_lists_the_differences(tmp_path):
    _checkpoint_of(build_config(_flags(tmp_path, "--seed", "1")))
    message = _refusal(build_config(_flags(tmp_path, "--seed", "2", "--algorithm", "gspo", "--resume")))
    assert "--resume_accept_mismatch" in message
    assert "seed: checkpoint 1, this run 2" in message
    assert "algo.algorithm: checkpoint 'hacpo', this run 'gspo'" in message
    assert "\n" not in message


def test_accepted_differences_are_logged(tmp_path, caplog):
    _checkpoint_of(build_config(_flags(tmp_path, "--seed", "1")))
    resumed = HACPOController(build_config(_flags(tmp_path, "--seed", "2", "--resume", "--resume_accept_mismatch")))
    try:
        with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
            resumed.checkpoints.prepare()
    finally:
        resumed.close()
    assert "continuing" in caplog.text and "seed: checkpoint 1, this run 2" in caplog.text


def test_same_settings_and_changed_run_length_resume(tmp_path):
    _checkpoint_of(build_config(_flags(tmp_path, "--max_steps", "2")))
    resumed = HACPOController(build_config(_flags(tmp_path, "--max_steps", "6", "--save_steps", "1", "--resume")))
    try:
        resumed.checkpoints.prepare()
    finally:
        resumed.close()
    checkpoint, state = resumed.checkpoints.resume_state
    assert checkpoint.name == "global_step2" and state["step"] == 2


def test_a_corrupt_trainer_state_stops_resume_before_workers_start(tmp_path):
    _checkpoint_of(build_config(_flags(tmp_path)))
    state_file = tmp_path / "checkpoints" / "global_step2" / "trainer_state.pt"
    state_file.write_bytes(b"\x00" * 64)
    resumed = HACPOController(build_config(_flags(tmp_path, "--resume")))
    try:
        with pytest.raises(CheckpointError, match=rf"trainer state .*{state_file} is corrupt"):
            resumed.checkpoints.prepare()
    finally:
        resumed.close()
    assert resumed.groups == []


def test_a_dangling_latest_stops_resume(tmp_path):
    _checkpoint_of(build_config(_flags(tmp_path)))
    (tmp_path / "checkpoints" / "latest").write_text("global_step9\n")
    resumed = HACPOController(build_config(_flags(tmp_path, "--resume")))
    try:
        with pytest.raises(CheckpointError, match="global_step9, which does not exist"):
            resumed.checkpoints.prepare()
    finally:
        resumed.close()


def test_resume_without_a_checkpoint_keeps_the_earlier_metrics(tmp_path):
    """A run that died before its first checkpoint: --resume has nothing to continue and must not truncate the
    metrics it would otherwise restart over."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "agent": "llama"}\n')
    resumed = HACPOController(build_config(_flags(tmp_path, "--resume")))
    try:
        with pytest.raises(RunFolderError, match=r"--resume: no checkpoint under .*metrics\.jsonl.*--overwrite"):
            resumed.checkpoints.prepare()
    finally:
        resumed.close()
    assert metrics.read_text() == '{"step": 1, "agent": "llama"}\n'


def test_the_fingerprint_is_taken_from_the_settings_as_given(tmp_path):
    """Preflight may replace a hub id by its local snapshot folder; the stored fingerprint keeps the id."""
    controller = HACPOController(build_config(_flags(tmp_path)))
    controller.cfg.agents[0].pretrain = "/snapshots/llama-local"
    assert controller.fingerprint["agent.llama.pretrain"] == "/m/llama"


@pytest.mark.parametrize("saved, resumed", [((), ("--one_step_off",)), (("--one_step_off",), ()),
                                            (("--one_step_off",), ("--one_step_off", "--own_old_logp", "recompute"))])
def test_a_resume_keeps_the_one_step_off_schedule(tmp_path, saved, resumed):
    """A one-step-off checkpoint holds the next step's batch, generated one version stale: resuming it synchronously,
    a synchronous checkpoint with the overlap, or with the other own-row old log-probs is refused by name."""
    engines = ("--rollout_backend", "hf_engine")
    _checkpoint_of(build_config(_flags(tmp_path, *engines, *saved)))
    message = _refusal(build_config(_flags(tmp_path, *engines, *resumed, "--resume")))
    field = "own_old_logp" if saved and resumed else "one_step_off"
    assert f"{field}: checkpoint" in message
