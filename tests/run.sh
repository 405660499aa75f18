#!/usr/bin/env bash
# Set up the environment (idempotent) and run the test suite: every tier, end-to-end runs included.
#   bash tests/run.sh                      # everything (unit, integration, e2e)
#   bash tests/run.sh --fast               # the unit tier only (a few minutes; no process, Ray or DeepSpeed engine)
#   bash tests/run.sh --tier integration   # one tier (repeatable); tiers are described in tests/README.md
#   bash tests/run.sh tests/kernels -k loss  # any other arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
args=()
for arg in "$@"; do
    if [[ "$arg" == "--fast" ]]; then args+=(--tier unit); else args+=("$arg"); fi
done
# The e2e tier's GPU train check compiles DeepSpeed's shared-memory op once for its restricted Python (over a minute
# on 2 cores): build it before the tier (not inside a test, not at install: the main job never needs it)
tiers=""
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --tier) tiers+=" ${args[i+1]:-}" ;;
        --tier=*) tiers+=" ${args[i]#--tier=}" ;;
    esac
done
op_glob="${HACPO_CACHE_DIR:-$ROOT/.cache}/gpu_train_check/torch_extensions/*/*.so"
if [[ -z "$tiers" || " $tiers " == *" e2e "* ]] && ! compgen -G "$op_glob" >/dev/null; then
    "$ROOT/.venv/bin/python" "$ROOT/tests/gpu_stack/train_check_cache.py" \
        || echo "[tests] warning: the GPU train check's shared-memory op did not build; its test builds it" >&2
fi
exec "$ROOT/.venv/bin/python" -m pytest "${args[@]}"
