"""The places in the project's cache folder that tests/gpu_stack/test_gpu_train_check.py runs
benchmarks/gpu_train_check.sh with, and the DeepSpeed op that check compiles, built ahead by tests/run.sh (before an
e2e tier, when it is missing).

The check runs a restricted Python (``gpu_image/python``: torch, Triton, transformers, no DeepSpeed) with DeepSpeed
from the carried folder (``deps``, made by benchmarks/build_carry_deps.sh), and DeepSpeed JIT-compiles its CPU
shared-memory op into ``torch_extensions`` on first use: over a minute on 2 cores. That op's build command names the
carried folder's and the restricted Python's include paths, so it is a build apart from the .venv's ops; built here
once at the same places with the same command, the check finds it up to date (ninja) and loads it.

    .venv/bin/python tests/gpu_stack/train_check_cache.py    # what tests/run.sh runs when the op is missing
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HACPO_CACHE_DIR") or REPO / ".cache") / "gpu_train_check"
DEPS = CACHE / "deps"
TORCH_EXTENSIONS = CACHE / "torch_extensions"


def gpu_image_python() -> Path:
    """The restricted Python, written afresh at a fixed place (its links lead to this interpreter's packages, so the
    torch include paths of a build against it stay the same)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from restricted_site import restricted_python

    root = CACHE / "gpu_image"
    shutil.rmtree(root, ignore_errors=True)  # links only: rmtree removes a link, never what it points to
    return restricted_python(root)


def build_deps(timeout: float = 300) -> subprocess.CompletedProcess:
    """``bash benchmarks/build_carry_deps.sh --out DEPS`` with this interpreter (files copied with their times)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HACPO_PYTHON=sys.executable)
    return subprocess.run(["bash", "benchmarks/build_carry_deps.sh", "--out", str(DEPS)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


OP_BUILD = """
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja
use_interpreter_ninja()  # the ninja the check's training processes use (another version would rebuild)
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and builder.is_compatible():
    builder.load(verbose=False)
    print(f"{builder.absolute_name()} built for the GPU train check")
"""


def prebuild() -> int:
    """Build the carried folder, the restricted Python and, with them, the shared-memory op as the check's training
    processes load it (CPU accelerator, DeepSpeed from the folder); returns an exit status."""
    built = build_deps()
    if built.returncode != 0:
        print(built.stderr[-3000:], file=sys.stderr)
        return built.returncode
    python = gpu_image_python()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=f"{REPO}:{DEPS}",
               TORCH_EXTENSIONS_DIR=str(TORCH_EXTENSIONS))
    done = subprocess.run([str(python), "-c", OP_BUILD], cwd=REPO, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(prebuild())
