#!/usr/bin/env bash
# Set up the environment (idempotent) and run the test suite: every tier, end-to-end runs included.
#   bash tests/run.sh                      # everything (unit, integration, e2e)
#   bash tests/run.sh --fast               # the unit tier only (a few minutes; no process, Ray or DeepSpeed engine)
#   bash tests/run.sh --tier integration   # one tier (repeatable); tiers are described in tests/README.md
#   bash tests/run.sh tests/kernels -k loss  # any other arguments go to pytest
#   bash tests/run.sh -n 0 tests/kernels --pdb  # in one process (the default runs a worker per CPU, see below)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# one pass over the arguments: --fast becomes --tier unit; note the tiers selected and whether the caller chose the
# workers (-n/--numprocesses, --dist or -p no:xdist win over the default below)
args=()
tiers=""
parallel=1
previous=""
for arg in "$@"; do
    [[ "$arg" == "--fast" ]] && arg="--tier=unit"
    case "$arg" in
        --tier=*) tiers+=" ${arg#--tier=}" ;;
        -n | -n* | --numprocesses | --numprocesses=* | --dist | --dist=* | no:xdist) parallel=0 ;;
    esac
    [[ "$previous" == "--tier" ]] && tiers+=" $arg"
    args+=("$arg")
    previous="$arg"
done
# The e2e tier's GPU train check compiles DeepSpeed's shared-memory op once for its restricted Python (over a minute
# on 2 cores): build it before the tier (not inside a test, not at install: the main job never needs it)
op_glob="${HACPO_CACHE_DIR:-$ROOT/.cache}/gpu_train_check/torch_extensions/*/*.so"
if [[ -z "$tiers" || " $tiers " == *" e2e "* ]] && ! compgen -G "$op_glob" >/dev/null; then
    "$ROOT/.venv/bin/python" "$ROOT/tests/gpu_stack/train_check_cache.py" \
        || echo "[tests] warning: the GPU train check's shared-memory op did not build; its test builds it" >&2
fi
# Tests run in parallel worker processes (pytest-xdist), one test file per worker at a time (--dist loadfile: a
# module's fixtures and its folder's Ray cluster stay in one process). Workers: one per CPU (nproc without the OpenMP
# limit above, which it would honour), at most 4 and at most one per 6 GiB of available memory (an e2e worker holds a
# Ray cluster and DeepSpeed engines). HACPO_TEST_WORKERS=N sets the number; -n/--numprocesses, --dist or -p no:xdist
# given here win (-n 0 runs the tests in this process, as --pdb needs).
if ((parallel)); then
    workers="${HACPO_TEST_WORKERS:-}"
    if [[ -z "$workers" ]]; then
        workers="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
        mem_kib="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || true)"
        if [[ -n "$mem_kib" ]] && ((mem_kib / 6291456 < workers)); then workers=$((mem_kib / 6291456)); fi
        ((workers > 4)) && workers=4
        ((workers < 1)) && workers=1
    fi
    if ! [[ "$workers" =~ ^[0-9]+$ ]]; then
        echo "error: HACPO_TEST_WORKERS must be a whole number of worker processes (0 runs the tests in one process), got '$workers'" >&2
        exit 2
    fi
    echo "[tests] $workers worker process(es) (pytest-xdist; HACPO_TEST_WORKERS=N or -n N to change)" >&2
    # the longest files first (tests/schedule.py); xdist's own reorder would put them last
    args=(-n "$workers" --dist loadfile --no-loadscope-reorder "${args[@]}")
fi
exec "$ROOT/.venv/bin/python" -m pytest "${args[@]}"
