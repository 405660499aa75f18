"""Every launcher finds the project's Python the same way (scripts/python_env.sh): an explicit HACPO_PYTHON /
HACPO_VENV (or a launcher's own PYTHON), else an active environment whose Python has the project, else the
repository's .venv, set up by scripts/install.sh.

The launchers run for real with ``HACPO_LOOKUP_ONLY=1`` (they print the chosen Python and stop), in a copy of the
repository's scripts whose ``.venv`` is a stand-in and whose ``scripts/install.sh`` only records that it ran, so no
test installs anything; ``python3`` on PATH is a Python without the project (the interpreter the venv was made from).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# launcher -> (arguments that reach its lookup, whether a missing project Python sets up .venv)
LAUNCHERS = {
    "examples/scripts/reproduce_table1.sh": ((), True),
    "examples/scripts/train_table1.sh": (("qwen3_1.7b_4b", "hacpo"), True),
    "examples/scripts/train_hacpo_tiny.sh": ((), True),
    "examples/scripts/train_gspo_tiny.sh": ((), True),
    "examples/scripts/throughput_vs_gspo.sh": ((), True),
    "examples/scripts/smoke_2gpu.sh": ((), False),
    "examples/scripts/smoke_3gpu_zero3.sh": ((), False),
    "benchmarks/gpu_check.sh": ((), False),
    "benchmarks/gpu_train_check.sh": ((), False),
    "benchmarks/build_carry_deps.sh": ((), True),
}
BARE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter without the venv's packages


def test_every_launcher_is_covered():
    launchers = {p.relative_to(REPO).as_posix() for p in [*REPO.glob("examples/scripts/*.sh"),
                                                           *REPO.glob("benchmarks/*.sh")]}
    assert launchers == set(LAUNCHERS)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the launchers and the lookup, with a stand-in .venv and an install.sh that records its run."""
    root = tmp_path_factory.mktemp("repo")
    for launcher in LAUNCHERS:
        (root / launcher).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / launcher, root / launcher)
    (root / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "python_env.sh", root / "scripts" / "python_env.sh")
    (root / "scripts" / "install.sh").write_text('echo "install.sh ran" >> "$(dirname "$0")/../install.log"\n')
    venv_python = root / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\nexit 0\n")
    venv_python.chmod(0o755)
    bare = root / "bare-bin" / "python3"
    bare.parent.mkdir()
    bare.write_text(f'#!/bin/sh\nexec {BARE_PYTHON} "$@"\n')
    bare.chmod(0o755)
    return root


def _lookup(tree: Path, launcher: str, **env: str) -> subprocess.CompletedProcess:
    (tree / "install.log").unlink(missing_ok=True)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "PYTHONPATH") and not k.startswith("HACPO_")}
    clean.update({"PATH": f"{tree / 'bare-bin'}:/usr/bin:/bin", "HACPO_LOOKUP_ONLY": "1", **env})
    return subprocess.run(["bash", str(tree / launcher), *LAUNCHERS[launcher][0]], env=clean, cwd=tree,
                          capture_output=True, text=True, timeout=60)


def test_the_stand_in_python3_lacks_the_project(tree):
    done = subprocess.run([str(tree / "bare-bin" / "python3"), "-c", "import openrlhf_hacpo"], cwd="/",
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0 and "openrlhf_hacpo" in done.stderr


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_without_a_project_python_on_path_the_launcher_takes_dot_venv(tree, launcher):
    done = _lookup(tree, launcher)
    venv_python = tree / ".venv" / "bin" / "python"
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(venv_python)
    assert f"[python] using {venv_python} (the repository's .venv; python3 on PATH lacks " in done.stderr
    sets_up = LAUNCHERS[launcher][1]
    assert (tree / "install.log").exists() == sets_up  # .venv set up (install.sh) unless the launcher never installs


# the explicit choices, through a launcher that installs on first use and one that never installs
EXPLICIT = ["examples/scripts/train_hacpo_tiny.sh", "benchmarks/gpu_check.sh"]


@pytest.mark.parametrize("launcher", EXPLICIT)
def test_hacpo_python_is_taken_as_given(tree, launcher):
    done = _lookup(tree, launcher, HACPO_PYTHON=str(BARE_PYTHON))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(BARE_PYTHON)
    assert f"[python] using {BARE_PYTHON} (HACPO_PYTHON)" in done.stderr
    assert not (tree / "install.log").exists()


@pytest.mark.parametrize("launcher", EXPLICIT)
def test_a_broken_hacpo_venv_is_an_error_naming_it(tree, launcher):
    broken = tree / "no-such-venv"
    done = _lookup(tree, launcher, HACPO_VENV=str(broken))
    assert done.returncode != 0 and not done.stdout
    assert f"HACPO_VENV={broken}: {broken}/bin/python is not an executable python" in done.stderr


def test_a_broken_hacpo_python_is_an_error_naming_it(tree):
    done = _lookup(tree, "examples/scripts/train_hacpo_tiny.sh", HACPO_PYTHON=str(tree / "nothing"))
    assert done.returncode != 0 and not done.stdout
    assert f"HACPO_PYTHON={tree / 'nothing'}: not an executable python" in done.stderr


def test_a_launchers_own_python_variable_is_explicit(tree):
    done = _lookup(tree, "benchmarks/gpu_check.sh", PYTHON=str(BARE_PYTHON))
    assert done.returncode == 0 and done.stdout.strip() == str(BARE_PYTHON)
    assert "(PYTHON)" in done.stderr


def test_an_active_environment_with_the_project_is_taken(tree):
    """VIRTUAL_ENV naming an environment where the project is installed (the repository's own .venv here)."""
    venv = Path(sys.prefix)
    done = _lookup(tree, "examples/scripts/train_hacpo_tiny.sh", VIRTUAL_ENV=str(venv))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(venv / "bin" / "python")
    assert "(VIRTUAL_ENV: it has openrlhf_hacpo torch transformers deepspeed ray)" in done.stderr
    assert not (tree / "install.log").exists()


def test_gpu_check_requires_only_what_it_runs(tree, tmp_path):
    """A GPU machine's Python: torch, Triton, transformers and pytest, but neither DeepSpeed nor Ray nor the project
    (stood in for by a Python whose find_spec sees only those four)."""
    fake = tmp_path / "gpu-bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"#!{BARE_PYTHON}\nimport sys\n"
                    "have = {'torch', 'triton', 'transformers', 'pytest'}\n"
                    "print(' '.join(m for m in sys.argv[3:] if m not in have))\n")  # argv: script, -c, code, modules
    fake.chmod(0o755)
    path = f"{fake.parent}:/usr/bin:/bin"
    done = _lookup(tree, "benchmarks/gpu_check.sh", PATH=path)
    assert done.returncode == 0 and done.stdout.strip() == str(fake), done.stderr
    done = _lookup(tree, "examples/scripts/train_hacpo_tiny.sh", PATH=path)  # needs DeepSpeed and Ray: .venv
    assert done.stdout.strip() == str(tree / ".venv" / "bin" / "python")
    assert "python3 on PATH lacks openrlhf_hacpo deepspeed ray" in done.stderr
