"""One ninja for DeepSpeed's op builds (:mod:`openrlhf_hacpo.utils.op_build`): the interpreter's own, whatever
``PATH`` a process starts with, so that the op ``scripts/install.sh`` built is found up to date by a training process
started from an activated environment and from a plain shell alike."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_hacpo.utils import op_build
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja

REPO = Path(__file__).resolve().parents[1]


def _fake_interpreter(folder: Path, with_ninja: bool) -> str:
    folder.mkdir(parents=True)
    python = folder / "python"
    python.write_text("")
    if with_ninja:
        ninja = folder / "ninja"
        ninja.write_text("#!/bin/sh\n")
        ninja.chmod(0o755)
    return str(python)


def test_the_interpreters_folder_goes_first_once(tmp_path, monkeypatch):
    monkeypatch.setattr(op_build.sys, "executable", _fake_interpreter(tmp_path / "env" / "bin", True))
    folder = str(tmp_path / "env" / "bin")
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", folder, "/bin"]))
    assert use_interpreter_ninja() == folder
    assert os.environ["PATH"].split(os.pathsep) == [folder, "/usr/bin", "/bin"]
    assert use_interpreter_ninja() == folder
    assert os.environ["PATH"].split(os.pathsep) == [folder, "/usr/bin", "/bin"]


def test_without_a_ninja_beside_the_interpreter_path_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(op_build.sys, "executable", _fake_interpreter(tmp_path / "bare" / "bin", False))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert use_interpreter_ninja() is None
    assert os.environ["PATH"] == "/usr/bin:/bin"


LOAD_THROUGH_THE_WORKER_PATH = """
import torch
from openrlhf_hacpo.actors.deepspeed_setup import init_agent_process_group
from openrlhf_hacpo.cli.train_hacpo import build_config
cfg = build_config(["--prompt_data", "x.jsonl", "--agent", "name=a,pretrain=x", "--no_ray"])
init_agent_process_group(cfg, cfg.resolved_agents[0], 0, 1, "127.0.0.1", None, torch.device("cpu"))
"""


@pytest.mark.integration  # starts training-process stand-ins that load DeepSpeed's op
def test_the_installed_op_is_up_to_date_with_and_without_the_environment_on_path(tmp_path):
    """The op ``scripts/install.sh`` built in ``.cache/torch_extensions`` is loaded, not rebuilt, by the training
    processes' path (``init_agent_process_group``), from a ``PATH`` with the environment's ``bin`` first (activated)
    and from one without it (a plain shell that finds another ninja)."""
    venv_bin = Path(sys.executable).parent
    other = shutil.which("ninja", path=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                        if p and Path(p) != venv_bin))
    if shutil.which("ninja", path=str(venv_bin)) is None or other is None:
        pytest.skip("needs a ninja beside the interpreter and another on PATH")
    extensions = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    built = sorted(extensions.glob("deepspeed_shm_comm/*.so"))
    if not built:
        pytest.skip(f"no shared-memory op built in {extensions} (scripts/install.sh builds it)")
    before = {p: p.stat().st_mtime_ns for p in built}
    plain = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p) != venv_bin)
    for path in (f"{venv_bin}{os.pathsep}{plain}", plain):
        env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", LOAD_THROUGH_THE_WORKER_PATH], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in built} == before, "the op was compiled again"
