#!/usr/bin/env bash
# The embedded default: tiny heterogeneous agents (a Llama with a character tokenizer and a Qwen3 with a BPE
# tokenizer) learn 3-digit addition together with HACPO on a CPU, in a few minutes, with nothing downloaded.
#
#   bash examples/scripts/train_hacpo_tiny.sh                              # preset "model", seed 0
#   bash examples/scripts/train_hacpo_tiny.sh --preset state --seed 1      # other agents / seed
#   bash examples/scripts/train_hacpo_tiny.sh --steps 40 -- --alpha 2      # trainer flags after --
#
#   bash examples/scripts/train_hacpo_tiny.sh --rebuild                    # agents built on this machine instead
#
# Runs the project's Python as every launcher finds it (scripts/python_env.sh: HACPO_PYTHON or HACPO_VENV when set,
# else an active environment that has the project installed, else the repository's .venv, set up on first use by
# scripts/install.sh), takes the agents that ship with the package
# (openrlhf_hacpo/zoo/agents, checked against their manifests; nothing is built), trains them together through
# `python -m openrlhf_hacpo.cli.train_hacpo`, which evaluates them before, during and after training, and prints a
# before/after table beside the README's seed spread for the same preset and algorithm. Outputs go to
# runs/tiny-<preset>-<algorithm>-s<seed>/ (summary.json, validation.png). Works from any directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/python_env.sh"
hacpo_python || exit
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"  # built by install.sh
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m openrlhf_hacpo.cli.tiny run "$@"
