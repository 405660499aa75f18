"""reproduce.run_state: the flag that continues (--resume), restarts (--overwrite) or starts a run folder, checked
against the trainer's own rules (it refuses --resume on outputs without a checkpoint, and a fresh run on outputs)."""
from __future__ import annotations

from pathlib import Path

import pytest

from openrlhf_hacpo.reproduce.run_state import OVERWRITE, RESUME, RUN_OUTPUTS, STATE_FILE, main, restart_flag


def _checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    folder = root / f"global_step{step}"
    (folder / "agents" / "a").mkdir(parents=True)
    if complete:
        (folder / STATE_FILE).write_bytes(b"")
    return folder


def test_an_absent_or_empty_folder_starts(tmp_path):
    assert restart_flag(tmp_path / "missing") is None
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "train.log").write_text("appended to, never replaced\n")
    assert restart_flag(tmp_path / "run") is None


@pytest.mark.parametrize("output", ["eval.jsonl", "metrics.jsonl", "hf", "rollouts"])
def test_outputs_without_a_checkpoint_start_over(tmp_path, output):
    path = tmp_path / output
    if output.endswith(".jsonl"):
        path.write_text('{"step": 0}\n')
    else:
        (path / "x").mkdir(parents=True)
    assert restart_flag(tmp_path) == OVERWRITE


def test_an_incomplete_or_half_written_checkpoint_is_not_continued(tmp_path):
    (tmp_path / "eval.jsonl").write_text('{"step": 0}\n')
    _checkpoint(tmp_path / "checkpoints", 10, complete=False)
    (tmp_path / "checkpoints" / ".global_step20.abc.tmp").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("global_step10")
    assert restart_flag(tmp_path) == OVERWRITE


def test_a_checkpoint_continues(tmp_path):
    (tmp_path / "eval.jsonl").write_text('{"step": 0}\n')
    _checkpoint(tmp_path / "checkpoints", 10)
    assert restart_flag(tmp_path) == RESUME
    aside = tmp_path / "other"
    (aside / ".global_step20.old-x7").mkdir(parents=True)  # a save killed between its two renames
    assert restart_flag(tmp_path / "empty_run", ckpt_dir=aside) == RESUME
    assert restart_flag(tmp_path / "empty_run", ckpt_dir=tmp_path / "nothing") is None


def test_the_command_prints_the_flag(tmp_path, capsys):
    (tmp_path / "eval.jsonl").write_text('{"step": 0}\n')
    assert main([str(tmp_path)]) == 0 and capsys.readouterr().out == "--overwrite\n"
    assert main([str(tmp_path / "new")]) == 0 and capsys.readouterr().out == ""
    _checkpoint(tmp_path / "ck", 3)
    assert main([str(tmp_path), "--ckpt_path", str(tmp_path / "ck")]) == 0 and capsys.readouterr().out == "--resume\n"


def test_the_rules_are_the_trainers(tmp_path):
    """The names run_state reads without importing the trainer are the trainer's; its checkpoint finder agrees."""
    from openrlhf_hacpo.trainer import checkpoint, run_folder
    from openrlhf_hacpo.trainer.checkpoint import CheckpointManager

    assert RUN_OUTPUTS == run_folder.RUN_OUTPUTS and STATE_FILE == checkpoint.STATE_FILE
    root = tmp_path / "checkpoints"
    _checkpoint(root, 4, complete=False)
    assert CheckpointManager(str(root)).steps() == [] and restart_flag(tmp_path) == OVERWRITE
    _checkpoint(root, 8)
    assert CheckpointManager(str(root)).steps() == [8] and restart_flag(tmp_path) == RESUME
