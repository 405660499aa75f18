#!/usr/bin/env bash
# Kernel check for a GPU machine (torch + triton installed; no network needed). From the repository root:
#
#   benchmarks/gpu_kernel_check.sh            # CUDA kernel tests, then the full benchmark sweep
#   benchmarks/gpu_kernel_check.sh --quick    # extra arguments go to bench_kernels.py
#
# 1. tests/kernels on CUDA with compiled Triton kernels (TRITON_INTERPRET unset), "not slow" tests only;
# 2. benchmarks/bench_kernels.py, which rewrites benchmarks/results/kernels_gpu.{json,md} after every shape and
#    prints its table last.
# Sized for about 8 minutes on one H100/H200: tests up to 3 minutes, benchmark up to 5 (a cut-short benchmark
# still leaves the figures of the shapes it finished).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
unset TRITON_INTERPRET
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_kernel_check: no CUDA device visible to $PY" >&2
    exit 2
fi
"$PY" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"

test_status=0
if "$PY" -c "import pytest" 2>/dev/null; then
    echo "== kernel tests (CUDA, compiled Triton) =="
    timeout 180 "$PY" -m pytest tests/kernels -q -m "not slow" -p no:cacheprovider || test_status=$?
else
    echo "gpu_kernel_check: pytest is not installed; skipping the tests" >&2
    test_status=3
fi

echo "== kernel benchmark =="
bench_status=0
timeout 300 "$PY" benchmarks/bench_kernels.py "$@" || bench_status=$?
if [ "$bench_status" -ne 0 ]; then
    echo "gpu_kernel_check: benchmark exited with $bench_status; partial results:" >&2
    cat benchmarks/results/kernels_gpu.md 2>/dev/null || true
fi

echo "gpu_kernel_check: tests exit $test_status, benchmark exit $bench_status"
[ "$test_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
