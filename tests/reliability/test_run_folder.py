"""Run folders: an earlier run is never overwritten by accident; one driver at a time; leftovers are reported."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config, main
from openrlhf_hacpo.trainer.run_folder import LOCK_FILE, RunLock, check_run_folder
from openrlhf_hacpo.utils.errors import RunFolderError


def _finished_run(folder: Path) -> dict[str, bytes]:
    """A run folder as a finished run leaves it; returns every file's bytes."""
    (folder / "checkpoints" / "global_step2" / "agents" / "llama").mkdir(parents=True)
    files = {
        "metrics.jsonl": b'{"step": 1, "agent": "llama"}\n{"step": 2, "agent": "llama"}\n',
        "eval.jsonl": b'{"step": 2, "agent": "llama", "accuracy": 0.5}\n',
        "checkpoints/latest": b"global_step2\n",
        "checkpoints/global_step2/trainer_state.pt": b"state",
        "notes.txt": b"mine",
    }
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_rerun_without_resume_is_refused_and_deletes_nothing(tmp_path, capsys):
    """The same command again in a finished run's folder: exit status 2, one line naming --resume and --overwrite,
    every file byte-identical (the refusal comes before any model is loaded)."""
    _finished_run(tmp_path)
    before = _snapshot(tmp_path)
    status = main(["--agent", "name=llama,pretrain=/nowhere/llama", "--prompt_data", "/nowhere/train.jsonl",
                   "--save_path", str(tmp_path), "--no_ray", "--n_samples_per_prompt", "2",
                   "--rollout_batch_size", "2", "--train_batch_size", "4", "--micro_train_batch_size", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("train_hacpo: error: save path")
    assert "--resume" in err[0] and "--overwrite" in err[0] and "metrics.jsonl" in err[0]
    assert _snapshot(tmp_path) == before


def test_overwrite_deletes_only_the_earlier_runs_outputs(tmp_path):
    _finished_run(tmp_path)
    cfg = build_config(["--agent", "name=llama,pretrain=/nowhere/llama", "--prompt_data", "x.jsonl",
                        "--save_path", str(tmp_path), "--overwrite", "--n_samples_per_prompt", "2",
                        "--rollout_batch_size", "2", "--train_batch_size", "4", "--micro_train_batch_size", "2"])
    check_run_folder(cfg, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_and_overwrite_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="overwrite and resume exclude each other"):
        build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path", str(tmp_path),
                      "--resume", "--overwrite", "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
                      "--train_batch_size", "4", "--micro_train_batch_size", "2"])


def test_a_folder_without_outputs_is_accepted(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "checkpoints").mkdir()  # empty: nothing to lose
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path", str(tmp_path),
                        "--n_samples_per_prompt", "2", "--rollout_batch_size", "2", "--train_batch_size", "4",
                        "--micro_train_batch_size", "2"])
    check_run_folder(cfg)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.integration
def test_a_live_driver_holds_the_folder(tmp_path, sleeper):
    import socket

    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(),
                                                  "started": "earlier", "processes": []}))
    with pytest.raises(RunFolderError, match=rf"another run \(driver pid {sleeper.pid}"):
        RunLock(str(tmp_path)).acquire()


@pytest.mark.integration
def test_processes_left_by_a_killed_driver_are_reported(tmp_path, sleeper, caplog):
    """A lock whose driver is gone (kill -9) but whose recorded Ray processes live on: a warning lists them."""
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                  "started": "earlier", "processes": [sleeper.pid]}))
    lock = RunLock(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
        lock.acquire()
    assert lock.leftovers == [sleeper.pid]
    assert f"kill {sleeper.pid}" in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
