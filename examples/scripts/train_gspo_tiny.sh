#!/usr/bin/env bash
# Baseline of the embedded default: the same shipped tiny agents, each trained alone with GSPO on its own rollouts
# (same prompts, same rollouts per agent as HACPO). Add `--n_samples_per_prompt 16` for GSPO with twice the
# rollouts. Other options as in train_hacpo_tiny.sh. Works from any directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$ROOT/examples/scripts/train_hacpo_tiny.sh" --algorithm gspo "$@"
