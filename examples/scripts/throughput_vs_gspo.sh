#!/usr/bin/env bash
# Throughput against GSPO in one command: GSPO, GSPO x2 (2G rollouts), Naive and HACPO on the same agents,
# prompts and machine, runs interleaved, a fixed number of steps after warm-up; writes
# benchmarks/results/throughput_<config>.{md,json,png} and prints the tables.
#
#   bash examples/scripts/throughput_vs_gspo.sh                      # tiny preset "model" (N = 2), on a CPU
#   bash examples/scripts/throughput_vs_gspo.sh three                # N = 3, with the N = 3 / N = 2 HACPO step
#   bash examples/scripts/throughput_vs_gspo.sh smollm2              # SmolLM2-135M-Instruct + a zoo agent, offline
#   bash examples/scripts/throughput_vs_gspo.sh gpu --model qwen=/models/Qwen3-1.7B \
#        --model llama=/models/Llama-3.2-1B-Instruct                 # on CUDA, vLLM rollouts, bf16
#   bash examples/scripts/throughput_vs_gspo.sh model --time_to_accuracy    # HACPO vs GSPO x2 to equal accuracy
#   bash examples/scripts/throughput_vs_gspo.sh model --rounds 4 -- --micro_train_batch_size 32
#   bash examples/scripts/throughput_vs_gspo.sh model --arms gspo,hacpo,gspo-overlap,hacpo-overlap \
#        -- --rollout_backend hf_engine                            # one-step-off overlap against synchronous
#                                                                  # steps, every arm with HF engine actors
#
# The first argument, when it does not start with "-", is the configuration; every other argument goes to
# benchmarks/throughput.py (see `python benchmarks/throughput.py --help`; trainer flags after --). Run folders
# go to runs/throughput/<config>/. Python: as every launcher finds it (scripts/python_env.sh: HACPO_PYTHON or
# HACPO_VENV when set, else an active environment that has the project installed, else the repository's .venv, set
# up on first use). Works from any directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/python_env.sh"
hacpo_python || exit
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
CONFIG=()
if [[ $# -gt 0 && "$1" != -* ]]; then
  CONFIG=(--config "$1")
  shift
fi
exec "$PY" "$ROOT/benchmarks/throughput.py" "${CONFIG[@]}" "$@"
