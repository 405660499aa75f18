"""benchmarks/gpu_train_check.sh, the single-GPU check of the training path, run here on CPU so it cannot rot, and
run the way a locked-down GPU node runs it: a Python that has torch, Triton and transformers but not DeepSpeed (nor
accelerate), with DeepSpeed and its dependencies taken from the folder benchmarks/build_carry_deps.sh builds."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import train_check_cache
from train_check_cache import DEPS, TORCH_EXTENSIONS, build_deps

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _run(args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=timeout)


# Kept in the project's cache folder (tests/gpu_stack/train_check_cache.py), as the zoo's agents are: the train check's
# DeepSpeed op build (below) and the restricted Python whose torch headers it compiles against, each at one place per
# checkout; tests/run.sh builds that op there ahead (train_check_cache.py).


@pytest.fixture(scope="module")
def gpu_image_python() -> Path:
    """The restricted Python, written afresh each session at a fixed place (train_check_cache.gpu_image_python)."""
    return train_check_cache.gpu_image_python()


@pytest.mark.integration
def test_the_restricted_python_has_no_deepspeed(gpu_image_python):
    done = _run([str(gpu_image_python), "-c", "import torch, transformers; import deepspeed"], 300)
    assert done.returncode != 0 and "No module named 'deepspeed'" in done.stderr


@pytest.mark.integration
def test_a_missing_deps_folder_is_named_with_the_command_that_builds_it(gpu_image_python, tmp_path):
    done = _run(["bash", "benchmarks/gpu_train_check.sh", "--device", "cpu"], 300, PYTHON=str(gpu_image_python),
                HACPO_GPU_DEPS=str(tmp_path / "nothing"))
    assert done.returncode == 2
    assert "DeepSpeed does not import" in done.stderr and "bash benchmarks/build_carry_deps.sh" in done.stderr


@pytest.mark.integration
def test_a_deps_folder_of_another_python_is_refused(gpu_image_python, tmp_path):
    (tmp_path / "BUILD_INFO.json").write_text(json.dumps({"python": "3.99", "machine": "x86_64"}))
    done = _run(["bash", "benchmarks/gpu_train_check.sh", "--device", "cpu"], 300, PYTHON=str(gpu_image_python),
                HACPO_GPU_DEPS=str(tmp_path))
    assert done.returncode == 2
    assert "was built for Python 3.99" in done.stderr and "build_carry_deps.sh --python-version" in done.stderr


@pytest.mark.e2e
def test_the_train_check_passes_on_cpu_with_deepspeed_from_the_carried_folder(gpu_image_python, tmp_path):
    # The carried folder is rebuilt at one place per checkout, and the DeepSpeed CPU shared-memory op that the check
    # JIT-compiles from its sources is kept beside it. The op's build command names the folder's and the restricted
    # Python's include paths, so it is a build of its own, apart from the ops scripts/install.sh prebuilt for the .venv
    # in the shared TORCH_EXTENSIONS_DIR (which it would otherwise rebuild over); and as those paths stay the same and
    # build_carry_deps.sh copies files with their times, ninja finds the build that tests/run.sh made there
    # (train_check_cache.prebuild) up to date (without it, the first session compiles it: over a minute on 2 cores).
    # The offload configurations are left out here: on a CPU they would compile cpu_adam as well, and
    # tests/gpu_stack/test_offload.py checks them with the .venv's prebuilt op.
    deps = DEPS
    built = build_deps()
    assert built.returncode == 0, built.stderr
    info = json.loads((deps / "BUILD_INFO.json").read_text())
    size = sum(p.stat().st_size for p in deps.rglob("*") if p.is_file() and p.name != "BUILD_INFO.json")
    assert info["packages"]["deepspeed"] and size == info["bytes"] and size < 64 * 2**20

    report = tmp_path / "report.md"
    done = _run(["bash", "benchmarks/gpu_train_check.sh", "--device", "cpu", "--out", str(tmp_path / "out"),
                 "--report", str(report), "--no_offload"], 1800, PYTHON=str(gpu_image_python), HACPO_GPU_DEPS=str(deps),
                TORCH_EXTENSIONS_DIR=str(TORCH_EXTENSIONS))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"DeepSpeed and its dependencies from {deps}" in done.stdout
    text = report.read_text()
    assert "Result: all checks passed" in text and "FAILED" not in text
    for check in ("train", "metrics", "updates", "evaluation", "checkpoints", "resume", "resumed steps",
                  "resume = uninterrupted (llama)", "resume = uninterrupted (qwen)", "resumed evaluation (qwen)",
                  "HF export (llama)", "HF export (qwen)"):
        assert f"| {check} | ok |" in text, check
    assert f"carried folder {deps}" in text  # DeepSpeed came from the folder, not from an install
