#!/usr/bin/env bash
# The evidence batches of the tiny comparison, each run at one commit from a git worktree pinned to it, so code work
# on the main checkout goes on beside them (docs/tiny.md, "The evidence at one commit").
#
#   bash scripts/evidence_batches.sh COMMIT [BATCH ...]     # default: every batch, in priority order
#
# Batches (benchmarks/compare_tiny.py; 2 runs at a time; each batch continues where it stopped when rerun):
#   paper-model     preset model, the paper's regime: HACPO, GSPO, GSPO x2, both naives; seeds 0-9
#   single-model    preset model, the single-update regime: the same arms and seeds
#   paper-size      preset size, the paper's regime: HACPO, GSPO x2, the paper's naive; seeds 0-4
#   paper-state     preset state, likewise
#   paper-ablations preset model, the paper's regime: -Adv, -omega, no foreign clip, no stepwise; seeds 0-4
#   paper-no-stepwise  preset model, the paper's regime: HACPO and -stepwise alone (for a commit whose other
#                   ablations ran already); seeds 0-4
#   confirm-model   preset model, the paper's regime, the main arms on the held-out seeds 10-19
#   mismatch-model  preset model, the paper's regime, hf_engine engines: fp32, bf16, and bf16 with each
#                   --rollout_is level x mode; seeds 0-4 (needs a commit with --engine_dtype and --rollout_is)
#
# The worktree goes to $EVIDENCE_ROOT/worktree-<commit> (default /work/evidence or ./evidence-runs), with its own
# virtual environment (an editable install imports the code of the checkout it was installed from), and the run
# folders to $EVIDENCE_ROOT/runs-<commit>. Reports go to $EVIDENCE_ROOT/runs-<commit>/results, never into the
# worktree: a report written over a tracked file would mark every later run of the worktree as a changed checkout
# (job.source_commit), and compare_tiny would refuse to table them. Copy a finished report into benchmarks/results/
# of the main checkout by hand.
set -euo pipefail

[[ $# -ge 1 ]] || { echo "usage: $0 COMMIT [BATCH ...]" >&2; exit 2; }
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$(git -C "$HERE" rev-parse --verify "$1^{commit}")" || { echo "$0: $1 is not a commit" >&2; exit 2; }
shift
SHORT="${COMMIT:0:12}"
ROOT="${EVIDENCE_ROOT:-$([[ -d /work ]] && echo /work/evidence || echo "$HERE/evidence-runs")}"
TREE="$ROOT/worktree-$SHORT"
RUNS="$ROOT/runs-$SHORT"
BATCHES=("$@")
[[ ${#BATCHES[@]} -gt 0 ]] || BATCHES=(paper-model single-model paper-size paper-state paper-ablations)

mkdir -p "$ROOT" "$RUNS"
if [[ ! -d "$TREE" ]]; then
    git -C "$HERE" worktree add --detach "$TREE" "$COMMIT"
fi
[[ "$(git -C "$TREE" rev-parse HEAD)" == "$COMMIT" ]] || { echo "$0: $TREE is not at $COMMIT" >&2; exit 1; }
[[ -z "$(git -C "$TREE" status --porcelain --untracked-files=no)" ]] || { echo "$0: $TREE has changes" >&2; exit 1; }
RESULTS="$RUNS/results"
HACPO_VENV="$TREE/.venv" bash "$TREE/scripts/install.sh"
PY="$TREE/.venv/bin/python"
export HACPO_RUNS_DIR="$RUNS"

SEEDS10=0,1,2,3,4,5,6,7,8,9
SEEDS5=0,1,2,3,4
HELD_OUT=10,11,12,13,14,15,16,17,18,19
MAIN=hacpo,gspo,gspo2x,naive-paper,naive-gated
run() {  # name, compare_tiny flags
    local name=$1; shift
    [[ -z "$(git -C "$TREE" status --porcelain --untracked-files=no)" ]] || { echo "$0: $TREE has changes" >&2; exit 1; }
    echo "[evidence $(date +%H:%M:%S)] batch $name at $SHORT: compare_tiny.py $*"
    (cd "$TREE" && "$PY" benchmarks/compare_tiny.py --jobs 2 --results_dir "$RESULTS" "$@") > "$RUNS/$name.log" 2>&1 \
        && echo "[evidence $(date +%H:%M:%S)] batch $name done" \
        || echo "[evidence $(date +%H:%M:%S)] batch $name FAILED (see $RUNS/$name.log)"
}
for batch in "${BATCHES[@]}"; do
    case "$batch" in
        paper-model)     run "$batch" --preset model --regime paper --arms "$MAIN" --seeds "$SEEDS10" ;;
        single-model)    run "$batch" --preset model --arms "$MAIN" --seeds "$SEEDS10" ;;
        paper-size)      run "$batch" --preset size --regime paper --arms hacpo,gspo2x,naive-paper --seeds "$SEEDS5" ;;
        paper-state)     run "$batch" --preset state --regime paper --arms hacpo,gspo2x,naive-paper --seeds "$SEEDS5" ;;
        paper-ablations) run "$batch" --preset model --regime paper --arms no-adv,no-omega,no-clip,no-stepwise \
                             --seeds "$SEEDS5" ;;
        paper-no-stepwise) run "$batch" --preset model --regime paper --arms hacpo,no-stepwise --seeds "$SEEDS5" ;;
        confirm-model)   run "$batch" --preset model --regime paper --arms "$MAIN" --seeds "$HELD_OUT" \
                             --runs_dir "$RUNS/compare_tiny/model-80steps-paper-heldout" \
                             --results_dir "$RESULTS/heldout" ;;
        mismatch-model)  run "$batch" --preset model --regime paper --arms mismatch --seeds "$SEEDS5" ;;
        *) echo "$0: unknown batch $batch" >&2; exit 2 ;;
    esac
done
