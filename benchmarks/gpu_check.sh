#!/usr/bin/env bash
# The GPU check anyone can run: one command, about 6-8 minutes on one H100/H200, needing only torch, triton,
# transformers and pytest (no Ray, DeepSpeed, vLLM or network). From the repository root:
#
#   bash benchmarks/gpu_check.sh
#
# Parts (each has its own time limit; a failure is recorded and the next part still runs):
#   1. tests     CUDA kernel tests (compiled Triton), the CUDA algorithm tests and the fused log-prob path on CUDA
#                (tests/kernels, tests/algorithms, tests/models; "not e2e")
#   2. kernels   benchmarks/bench_kernels.py --quick --no-loss: log-prob kernels and fused linear log-probs
#   3. loss      benchmarks/bench_kernels.py --only loss: the fused loss kernel against the op-by-op torch loss
#   4. step      benchmarks/bench_step.py: one scoring pass and one update micro-batch, full logits vs fused
#   5. update    benchmarks/gpu_policy_update.py: HACPO updates of a zoo agent in bf16 on both kernel backends,
#                a non-finite update skipped at m = 2, peak memory
#   6. tune      benchmarks/tune_loss_tiles.py: GPU time of the loss kernels per launch tile
# PARTS="tests step" runs a subset (default: all six).
# Results: benchmarks/results/gpu_check.md (summary) and the tables each part writes (kernels_gpu.md,
# kernels_gpu_loss.md, step_cuda.md, policy_update_cuda.md, loss_tiles_cuda.md); copied to $OUT when that variable
# names a folder. The summary replaces gpu_check.md only when every part passed; a run with a failed part, or
# without torch or a CUDA device, writes it beside it to gpu_check.failed.md (and bench_kernels.py, failing or cut
# short, leaves its tables as they were and what it measured in <table>.failed.md). Without a CUDA device every part
# is reported as skipped and the script exits 0. HACPO_RESULTS_DIR moves the results folder (summary and tables).
#
# Python (scripts/python_env.sh): HACPO_PYTHON or PYTHON or HACPO_VENV when set, else an active environment or
# python3 on PATH that has torch, Triton, transformers and pytest (a GPU machine's preinstalled Python), else the
# repository's .venv when it exists. Nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source "$ROOT/scripts/python_env.sh"
hacpo_python --var PYTHON --no-install torch triton transformers pytest || exit 2
PARTS=${PARTS:-tests kernels loss step update tune}
RESULTS=${HACPO_RESULTS_DIR:-benchmarks/results}
SUMMARY=$RESULTS/gpu_check.md
FAILED=$RESULTS/gpu_check.failed.md
mkdir -p "$RESULTS"
export HACPO_RESULTS_DIR=$RESULTS  # the parts' tables (benchmarks/results_io.py) go there too
STARTED=$(mktemp)  # files newer than this one were written by this run
DRAFT=$(mktemp "$RESULTS/.gpu_check.XXXXXX")  # the summary while the run goes (same folder: moved, not copied)
SITE=$(mktemp -d)
trap 'rm -rf "$STARTED" "$DRAFT" "$SITE"' EXIT

# finish STATUS: the summary over gpu_check.md when every part passed (STATUS 0), else beside it in gpu_check.failed.md
finish() {
    chmod 644 "$DRAFT"
    if [ "$1" -eq 0 ]; then
        mv -f "$DRAFT" "$SUMMARY" && rm -f "$FAILED"
        echo "gpu_check: summary in $SUMMARY"
    else
        mv -f "$DRAFT" "$FAILED"
        echo "gpu_check: not a complete passing run: its summary is in $FAILED ($SUMMARY is unchanged)"
    fi
}

# the kernels/ folder is imported as hacpo_kernels (setup.py maps it); without an install, a link does the same
ln -s "$ROOT/kernels" "$SITE/hacpo_kernels"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

versions=$("$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')" 2>&1)
imports=$?
{
    echo "# GPU check"
    echo
    echo "Command: \`bash benchmarks/gpu_check.sh\`, $(date -u "+%Y-%m-%d %H:%M UTC")"
    echo
    echo "$versions"
    echo
    echo "| part | result | seconds |"
    echo "|---|---|---|"
} > "$DRAFT"

if [ "$imports" -ne 0 ]; then
    for part in $PARTS; do
        echo "| $part | failed ($PY cannot import torch, triton and transformers) | 0 |" >> "$DRAFT"
    done
    cat "$DRAFT"
    finish 1
    exit 1
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    for part in $PARTS; do echo "| $part | skipped (no CUDA device) | 0 |" >> "$DRAFT"; done
    cat "$DRAFT"
    finish 1
    exit 0
fi

failures=0
part() {  # part NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    case " $PARTS " in *" $name "*) ;; *) return 0 ;; esac
    local log="$RESULTS/gpu_$name.log" start=$SECONDS rc
    echo "== $name: $* (limit ${limit}s)"
    timeout "$limit" "$@" > "$log" 2>&1
    rc=$?
    tail -n 25 "$log"
    local verdict="ok"
    if [ "$rc" -eq 124 ]; then verdict="timed out after ${limit}s"; elif [ "$rc" -ne 0 ]; then verdict="failed (exit $rc)"; fi
    [ "$verdict" = "ok" ] || failures=$((failures + 1))
    echo "| $name | $verdict | $((SECONDS - start)) |" >> "$DRAFT"
}

part tests 200 "$PY" -m pytest tests/kernels tests/algorithms tests/models -q -m "not e2e" -p no:cacheprovider
part kernels 150 "$PY" benchmarks/bench_kernels.py --quick --no-loss --out kernels_gpu
part loss 120 "$PY" benchmarks/bench_kernels.py --only loss
part step 150 "$PY" benchmarks/bench_step.py
part update 90 "$PY" benchmarks/gpu_policy_update.py
part tune 240 "$PY" benchmarks/tune_loss_tiles.py

{
    echo
    echo "## Test summary"
    echo
    echo '```'
    grep -E "passed|failed|error" "$RESULTS/gpu_tests.log" 2>/dev/null | tail -n 5
    echo '```'
} >> "$DRAFT"
cat "$DRAFT"
finish "$failures"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    # what this run wrote (the device tool brings back at most 8 files)
    find "$RESULTS" -maxdepth 1 -type f -newer "$STARTED" \( -name 'gpu_*' -o -name 'kernels_gpu*' -o -name 'step_cuda*' -o -name 'loss_tiles_cuda*' \
        -o -name 'policy_update_cuda*' \) | sort | head -n 8 | xargs -r cp -t "$OUT/"
fi
echo "gpu_check: $failures part(s) failed"
[ "$failures" -eq 0 ]
