#!/usr/bin/env bash
# Set up the environment (idempotent) and run the whole test suite, end-to-end tests included.
#   bash tests/run.sh                 # everything
#   bash tests/run.sh -m "not slow"   # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
