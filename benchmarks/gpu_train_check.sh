#!/usr/bin/env bash
# The training path on one GPU, without Ray or vLLM: DeepSpeed ZeRO-2 and ZeRO-3 on CUDA, bf16, gradient
# checkpointing, the fused log-probs and the Triton loss inside real updates, a KL reference, evaluation, a checkpoint
# every step with the CUDA RNG state, --resume checked against an uninterrupted run, and the HF export reloaded.
# About a minute on one H100/H200; needs only torch, Triton and transformers (no network). From the repository root:
#
#   bash benchmarks/gpu_train_check.sh                     # report: benchmarks/results/gpu_train_check.md
#                                                          # (a failed run: gpu_train_check.failed.md beside it)
#   bash benchmarks/gpu_train_check.sh --device cpu        # the same on CPU (the test suite runs it this way)
#   HACPO_GPU_DEPS=DIR bash benchmarks/gpu_train_check.sh  # DeepSpeed from DIR where it is not installed
#
# DeepSpeed is pure Python. Where it does not import, the check takes it from a folder holding DeepSpeed and its
# dependencies (default .cache/gpu_deps, or HACPO_GPU_DEPS), built on a machine with the project's .venv by
#   bash benchmarks/build_carry_deps.sh [--python-version 3.X]
# and appended to PYTHONPATH. Other flags go to benchmarks/gpu_train_check.py (--out, --report, --fp32, --tolerance,
# --no_offload).
# With OUT naming a folder, the report and the run logs are also copied there.
# Exit status: 0 when every check passed, 1 when one failed, 2 when the check could not start.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# the Python (scripts/python_env.sh): HACPO_PYTHON or PYTHON or HACPO_VENV when set, else one that has torch, Triton
# and transformers (an active environment, python3 on PATH), else the repository's .venv when it exists; no install
source "$ROOT/scripts/python_env.sh"
hacpo_python --var PYTHON --no-install torch triton transformers || exit 2
DEPS=${HACPO_GPU_DEPS:-$ROOT/.cache/gpu_deps}

# the kernels/ folder is imported as hacpo_kernels (setup.py maps it); without an install, a link does the same
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
ln -s "$ROOT/kernels" "$SITE/hacpo_kernels"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# DeepSpeed compiles its CPU communication op on first use; keep it with the test suite's build
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}
case " $* " in
    *" --device cpu "*) export CUDA_VISIBLE_DEVICES="" ;;  # the whole run on CPU, even on a GPU machine
    *) unset TRITON_INTERPRET ;;
esac

if ! "$PY" -c "import deepspeed" > /dev/null 2>&1; then
    if [ ! -f "$DEPS/BUILD_INFO.json" ]; then
        echo "gpu_train_check: DeepSpeed does not import with $PY and $DEPS holds no DeepSpeed folder; build one where" \
             "the project's .venv is installed (bash benchmarks/build_carry_deps.sh), copy it here and set" \
             "HACPO_GPU_DEPS to it" >&2
        exit 2
    fi
    # the folder must match this interpreter (its compiled dependencies are per Python version and platform)
    if ! "$PY" - "$DEPS/BUILD_INFO.json" <<'PY'
import json
import platform
import sys

info = json.load(open(sys.argv[1]))
here = f"{sys.version_info.major}.{sys.version_info.minor}"
if info["python"] != here or info["machine"] != platform.machine():
    sys.exit(f"gpu_train_check: {sys.argv[1]} was built for Python {info['python']} on {info['machine']}, this is "
             f"Python {here} on {platform.machine()}: rebuild it with "
             f"bash benchmarks/build_carry_deps.sh --python-version {here}")
PY
    then
        exit 2
    fi
    export PYTHONPATH="$PYTHONPATH:$DEPS" HACPO_GPU_DEPS_USED="$DEPS"
    echo "gpu_train_check: DeepSpeed and its dependencies from $DEPS"
fi

"$PY" benchmarks/gpu_train_check.py "$@"
status=$?
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    # the default report (or the record of a failed run) and run logs, for a caller that collects what lands in $OUT
    cp benchmarks/results/gpu_train_check.md benchmarks/results/gpu_train_check.failed.md runs/gpu_train_check/*.log \
        runs/gpu_train_check/*.md "$OUT/" 2>/dev/null
fi
exit $status
