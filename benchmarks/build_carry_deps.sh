#!/usr/bin/env bash
# Build the folder benchmarks/gpu_train_check.sh takes DeepSpeed from on a GPU machine that has torch, Triton and
# transformers but not DeepSpeed (and cannot install packages): DeepSpeed and the packages it and transformers'
# ZeRO-3 loading import that such a machine lacks, and peft (LoRA agents), copied from the project's .venv.
#
#   bash benchmarks/build_carry_deps.sh                          # -> .cache/gpu_deps (git-ignored), about 22 MiB
#   bash benchmarks/build_carry_deps.sh --python-version 3.12    # for another Python: the compiled packages
#                                                                # (pydantic_core, psutil, msgpack) as that
#                                                                # version's wheels, downloaded with pip
#   bash benchmarks/build_carry_deps.sh --out DIR
#
# The packages (DeepSpeed 0.19.6's requirements, accelerate for transformers' HfDeepSpeedConfig, peft for
# --lora_rank; all pure Python but pydantic_core, psutil and msgpack):
#   deepspeed, accelerate, hjson, py-cpuinfo, einops, msgpack, psutil, pydantic, pydantic_core, annotated-types,
#   typing-inspection, typing-extensions (pydantic needs a newer one than torch does), peft
# torch, numpy, packaging, tqdm, pyyaml, safetensors and huggingface_hub come with torch and transformers (peft needs
# nothing else).
# Not carried: what compiles DeepSpeed's C++ ops. --adam_offload uses DeepSpeed's CPU Adam, a C++ op built on its
# first use (JIT, into TORCH_EXTENSIONS_DIR) with ninja (the `ninja` binary or the pip package), a C++ compiler (g++)
# and the Python headers (Python.h, e.g. python3.12-dev); without them the first adam_offload run fails while
# building "cpu_adam" (an op built against another torch does not load, so a build cannot be carried either).
# The other configurations compile nothing.
# BUILD_INFO.json in the folder names the Python version and machine it was built for; the folder must stay under
# 64 MiB (the device tool's limit on what travels with the working tree).
# The packages are copied from the project's Python (scripts/python_env.sh): HACPO_PYTHON or PYTHON or HACPO_VENV
# when set, else an active environment with the project installed, else the repository's .venv (set up on first use).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/python_env.sh"
hacpo_python --var PYTHON || exit
exec "$PY" - "$ROOT" "$@" <<'PY'
import argparse
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CARRY = ["deepspeed", "accelerate", "hjson", "py-cpuinfo", "einops", "msgpack", "psutil", "pydantic", "pydantic_core",
         "annotated-types", "typing-inspection", "typing-extensions", "peft"]
LIMIT = 64 * 2**20

root = Path(sys.argv[1])
parser = argparse.ArgumentParser(prog="build_carry_deps.sh")
parser.add_argument("--out", type=Path, default=root / ".cache" / "gpu_deps")
parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
parser.add_argument("--platform", action="append", default=None,
                    help="wheel platform tag(s) accepted for --python-version (repeatable; pip matches tags exactly; "
                         "default: the x86_64 manylinux tags 2_28, 2_27, 2_17, 2014 and 1)")
args = parser.parse_args(sys.argv[2:])
platforms = args.platform or ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                              "manylinux2014_x86_64", "manylinux1_x86_64"]
same_python = args.python_version == f"{sys.version_info.major}.{sys.version_info.minor}"


def dist_files(dist):
    """(source, relative path) of every installed file of a distribution, without byte code."""
    for item in dist.files or []:
        if "__pycache__" in item.parts or item.suffix == ".pyc" or item.parts[0] == "..":
            continue
        source = Path(dist.locate_file(item))
        if source.is_file():
            yield source, Path(item)


def compiled(dist) -> bool:
    return any(str(item).endswith((".so", ".pyd")) for item in dist.files or [])


out = args.out
tmp = Path(tempfile.mkdtemp(prefix=".gpu_deps-", dir=out.parent if out.parent.exists() else None))
versions = {}
try:
    for name in CARRY:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"build_carry_deps: {name} is not installed with {sys.executable}; install the project first "
                     "(bash scripts/install.sh)")
        versions[name] = dist.version
        if compiled(dist) and not same_python:
            with tempfile.TemporaryDirectory() as wheels:
                subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                "--python-version", args.python_version,
                                *[arg for tag in platforms for arg in ("--platform", tag)],
                                "--implementation", "cp", f"{name}=={dist.version}", "-d", wheels], check=True)
                for wheel in Path(wheels).glob("*.whl"):
                    zipfile.ZipFile(wheel).extractall(tmp)
            continue
        for source, relative in dist_files(dist):
            target = tmp / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    if size >= LIMIT:
        sys.exit(f"build_carry_deps: the folder would hold {size / 2**20:.1f} MiB, over the 64 MiB limit")
    machine = platform.machine() if same_python else ("aarch64" if "aarch64" in platforms[0] else "x86_64")
    info = {"python": args.python_version, "machine": machine, "packages": versions, "bytes": size}
    (tmp / "BUILD_INFO.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
finally:
    if tmp.exists():
        shutil.rmtree(tmp)
print(f"build_carry_deps: {out} ({size / 2**20:.1f} MiB) for Python {args.python_version}: "
      + ", ".join(f"{k} {v}" for k, v in versions.items()))
PY
