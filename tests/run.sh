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
exec "$ROOT/.venv/bin/python" -m pytest "${args[@]}"
