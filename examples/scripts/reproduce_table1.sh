#!/usr/bin/env bash
# The paper's Table 1 end to end: prepare -> base-model evaluations -> training runs -> evaluations -> table.
#
#   bash examples/scripts/reproduce_table1.sh                 # every pair and method (8 GPUs, hub access)
#   PAIRS=qwen3_1.7b_4b METHODS="hacpo gspo" bash examples/scripts/reproduce_table1.sh
#
# Resumable: each finished stage leaves a done-marker under $OUT/.done/; a rerun skips finished stages, and a
# training run that stopped part-way continues from its last joint checkpoint (--resume). Delete a marker to redo
# that stage. The table is printed again at every run, from whatever results exist.
#
#   OUT            everything goes here [runs/table1]: <pair>/<method>/ runs, eval/, table/
#   DATA_DIR       prepared data [${HACPO_CACHE_DIR:-.cache}/reproduce/data]
#   PAIRS          pairs of examples/scripts/train_table1.sh [all three]
#   METHODS        methods of train_table1.sh [hacpo gspo gspo_x2 grpo naive]
#   PREPARE_FLAGS  extra flags of the prepare command, e.g. "--source_dir /data/hf" on an offline machine
#   EVAL_FLAGS     extra flags of the evaluation command, e.g. "--vllm_num_engines 8"
#   TRAIN_FLAGS    extra trainer flags for every run
#
# Models come from the hub (their ids are in examples/scripts/train_table1.sh and below).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT=${OUT:-runs/table1}
DATA_DIR=${DATA_DIR:-${HACPO_CACHE_DIR:-.cache}/reproduce/data}
PAIRS=${PAIRS:-"qwen3_1.7b_4b qwen3_4b_llama3.2_3b qwen3_4b_instruct"}
METHODS=${METHODS:-"hacpo gspo gspo_x2 grpo naive"}
read -r -a PREPARE_EXTRA <<< "${PREPARE_FLAGS:-}"
read -r -a EVAL_EXTRA <<< "${EVAL_FLAGS:-}"
read -r -a TRAIN_EXTRA <<< "${TRAIN_FLAGS:-}"
DONE="$OUT/.done"
mkdir -p "$DONE"
BENCHMARKS=(math500 math gsm8k aime25 amc23 minerva olympiadbench)
BENCH_FILES=("${BENCHMARKS[@]/#/$DATA_DIR/}")
BENCH_FILES=("${BENCH_FILES[@]/%/.jsonl}")

# stage NAME COMMAND...: run COMMAND unless NAME is done; mark it done when COMMAND succeeds
stage() {
    local name=$1
    shift
    if [[ -e "$DONE/$name" ]]; then
        echo "[reproduce] $name: done earlier, skipped" >&2
        return 0
    fi
    echo "[reproduce] $name: $*" >&2
    "$@"
    date -u +%FT%TZ > "$DONE/$name"
}

models_of() {
    case "$1" in
        qwen3_1.7b_4b) echo "Qwen/Qwen3-1.7B-Base Qwen/Qwen3-4B-Base" ;;
        qwen3_4b_llama3.2_3b) echo "Qwen/Qwen3-4B-Base meta-llama/Llama-3.2-3B-Instruct" ;;
        qwen3_4b_instruct) echo "Qwen/Qwen3-4B Qwen/Qwen3-4B-Instruct-2507" ;;
        *) echo "reproduce_table1.sh: unknown pair '$1'" >&2; exit 2 ;;
    esac
}

for pair in $PAIRS; do models_of "$pair" > /dev/null; done
for method in $METHODS; do
    case "$method" in
        hacpo|gspo|gspo_x2|grpo|naive) ;;
        *) echo "reproduce_table1.sh: unknown method '$method'" >&2; exit 2 ;;
    esac
done

evaluate() {
    python3 -m openrlhf_hacpo.cli.evaluate --data "${BENCH_FILES[@]}" --skip_existing "${EVAL_EXTRA[@]}" "$@"
}

# 1. data
stage prepare python3 -m openrlhf_hacpo.cli.prepare --output_dir "$DATA_DIR" "${PREPARE_EXTRA[@]}"

# 2. base models (each once, even when it belongs to two pairs)
declare -A seen=()
for pair in $PAIRS; do
    for model in $(models_of "$pair"); do
        [[ -n "${seen[$model]:-}" ]] && continue
        seen[$model]=1
        stage "base_${model//\//__}" evaluate --model "$model" --output_dir "$OUT/eval/base"
    done
done

# 3. training runs, then 4. their evaluations
for pair in $PAIRS; do
    for method in $METHODS; do
        run="$OUT/$pair/$method"
        stage "train_${pair}_${method}" env SAVE_PATH="$run" DATA_DIR="$DATA_DIR" \
            bash "$ROOT/examples/scripts/train_table1.sh" "$pair" "$method" --resume "${TRAIN_EXTRA[@]}"
        stage "eval_${pair}_${method}" evaluate --run "$run" --output_dir "$OUT/eval/$pair/$method"
    done
done

# 5. the table, from every result so far
python3 -m openrlhf_hacpo.cli.table --results "$OUT/eval" --tables 1 --output_dir "$OUT/table"
