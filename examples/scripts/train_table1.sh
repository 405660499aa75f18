#!/usr/bin/env bash
# One training run of the paper's Table 1: a model pair and a method, 8 GPUs on one node.
#
#   bash examples/scripts/train_table1.sh PAIR METHOD [trainer flags ...]
#
#   PAIR    qwen3_1.7b_4b         Qwen3-1.7B-Base + Qwen3-4B-Base           (α 1, δ 0.2, δ_step 0.025)
#           qwen3_4b_llama3.2_3b  Qwen3-4B-Base + Llama-3.2-3B-Instruct     (α 1, δ 0.2, δ_step 0.025)
#           qwen3_4b_instruct     Qwen3-4B + Qwen3-4B-Instruct              (α 3, δ 0.2, δ_step 0.01)
#           small                 SmolLM2-135M-Instruct + zoo qwenS, SCALE=small only (α 1, δ 0.2, δ_step 0.025)
#   METHOD  hacpo    both agents learn together from all rollouts
#           gspo     each agent alone on its own 8 rollouts per prompt (two independent runs in one job)
#           gspo_x2  each agent alone on 16 rollouts per prompt (HACPO's rollout budget per learner)
#           grpo     each agent alone, GRPO (token ratios, clip [0.8, 1.28], dual clip 3)
#           naive    shared rollouts, plain joint-mean advantage, GSPO clip on every row
#
# Agents are named as the paper names the models, so the evaluation command labels their results for the table.
# Every agent gets 4 GPUs: 2 data-parallel policy workers (DeepSpeed ZeRO-3, bf16) and 2 vLLM engines (TP 1). The
# settings follow the paper (App. A, Table 5) and the official launchers (docs/reproduce.md, "Where this reproduction
# follows which source"): 128 prompts x G rollouts per agent and step, 512 rows per update, lr 1e-6, KL 0.001 to the
# initial policy, HACPO's capability window 5, responses up to 4096 tokens in training and in validation (the paper's
# and both official launchers' training length; 8196 is the paper's evaluation length, used by cli.evaluate), the
# final EOS trained and foreign responses re-tokenized with their EOS string (--eos_policy text, the main branch
# that produced the paper's numbers), greedy validation on
# MATH-500 every 3 steps and before the first one, a joint checkpoint every 10 steps.
# Paths are variables; the defaults read what `python -m openrlhf_hacpo.cli.prepare` writes. Trainer flags after
# METHOD override the script's (argparse keeps the last value), e.g. --max_steps 6.
#
#   MODEL_A / MODEL_B   the pair's models (hub ids or local folders; required for the small pair)
#   TRAIN_AGENTS        which agents train: "a b" [default], "a" or "b" (single-agent methods only; a shared
#                       baseline trained in another pair, see reproduce_table1.sh SHARE_BASELINES)
#   DATA_DIR            prepared data [${HACPO_CACHE_DIR:-.cache}/reproduce/data]
#   PROMPT_DATA         training prompts [$DATA_DIR/math_train.jsonl; small: $DATA_DIR/champ_small.jsonl]
#   EVAL_DATA           validation prompts [$DATA_DIR/math500.jsonl; small: $DATA_DIR/champ_small.jsonl]
#   SAVE_PATH           run folder [runs/table1/<PAIR>/<METHOD>]
#   GENERATE_MAX_LEN    response length of rollouts and validation [4096; small: 8]
#   SCALE               paper [default]: the settings above. small: the same method flags on a CPU in minutes,
#                       for reproduce_table1.sh's small mode: no Ray, transformers generate, ZeRO-0 fp32, 1 prompt
#                       x G/4 rollouts per step, 2 rows per update (HACPO: 2 updates per step), 2 steps, prompts up
#                       to 112 tokens, no joint checkpoint at the end (the HF checkpoints are what the pipeline
#                       evaluates; a stopped run starts over)
#
# Python: the one every launcher takes (scripts/python_env.sh): HACPO_PYTHON or HACPO_VENV when set, else an active
# environment (VIRTUAL_ENV, CONDA_PREFIX, python3 on PATH) that has the project installed, else the repository's .venv.
#
# Start a Ray cluster first (`ray start --head --num-gpus 8`) or let the trainer start a local one.
set -euo pipefail

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
PAIR=$1
METHOD=$2
shift 2
SCALE=${SCALE:-paper}
case "$SCALE" in
    paper|small) ;;
    *) echo "train_table1.sh: SCALE must be paper or small, got '$SCALE'" >&2; exit 2 ;;
esac

ALPHA=1.0
DELTA=0.2
DELTA_STEP=0.025
case "$PAIR" in
    qwen3_1.7b_4b)
        AGENT_A=Qwen3-1.7B-Base; MODEL_A=${MODEL_A:-Qwen/Qwen3-1.7B-Base}
        AGENT_B=Qwen3-4B-Base; MODEL_B=${MODEL_B:-Qwen/Qwen3-4B-Base} ;;
    qwen3_4b_llama3.2_3b)
        AGENT_A=Qwen3-4B-Base; MODEL_A=${MODEL_A:-Qwen/Qwen3-4B-Base}
        AGENT_B=Llama-3.2-3B-Instruct; MODEL_B=${MODEL_B:-meta-llama/Llama-3.2-3B-Instruct} ;;
    qwen3_4b_instruct)
        AGENT_A=Qwen3-4B; MODEL_A=${MODEL_A:-Qwen/Qwen3-4B}
        AGENT_B=Qwen3-4B-Instruct; MODEL_B=${MODEL_B:-Qwen/Qwen3-4B-Instruct-2507}
        ALPHA=3.0
        DELTA_STEP=0.01 ;;
    small)
        [[ "$SCALE" == small ]] || { echo "train_table1.sh: pair 'small' needs SCALE=small" >&2; exit 2; }
        [[ -n "${MODEL_A:-}" && -n "${MODEL_B:-}" ]] || {
            echo "train_table1.sh: pair 'small' needs MODEL_A and MODEL_B (python -m openrlhf_hacpo.cli.reproduce_small" \
                 "models prints them)" >&2; exit 2; }
        AGENT_A=SmolLM2-135M-Instruct
        AGENT_B=qwenS ;;
    *) echo "train_table1.sh: unknown pair '$PAIR'" >&2; usage ;;
esac

# G per method at the paper's scale; the small scale keeps the methods' ratios with G/4
if [[ "$SCALE" == paper ]]; then G=8; else G=2; fi
GSPO_CLIP=(--eps_clip_low 3e-4 --eps_clip_high 4e-4)
case "$METHOD" in
    hacpo)   METHOD_FLAGS=(--algorithm hacpo --n_samples_per_prompt "$G" "${GSPO_CLIP[@]}" --alpha "$ALPHA"
                           --cross_clip_delta "$DELTA" --cross_clip_step "$DELTA_STEP" --capability_window 5) ;;
    gspo)    METHOD_FLAGS=(--algorithm gspo --n_samples_per_prompt "$G" "${GSPO_CLIP[@]}") ;;
    gspo_x2) METHOD_FLAGS=(--algorithm gspo --n_samples_per_prompt $((2 * G)) "${GSPO_CLIP[@]}") ;;
    # the grpo preset's clip [1-0.2, 1+0.28]; verl's dual clip c = 3 (clip_ratio_c) on negative-advantage tokens;
    # aggregation as the paper's GRPO formula (mean over responses of the per-response token mean); a stock verl
    # GRPO run averages over tokens instead: add --loss_agg token-mean
    grpo)    METHOD_FLAGS=(--algorithm grpo --n_samples_per_prompt "$G" --dual_clip_c 3
                           --loss_agg seq-mean-token-mean) ;;
    naive)   METHOD_FLAGS=(--algorithm naive --n_samples_per_prompt "$G" "${GSPO_CLIP[@]}") ;;
    *) echo "train_table1.sh: unknown method '$METHOD'" >&2; usage ;;
esac

AGENT_FLAGS=()
TRAIN_AGENTS=${TRAIN_AGENTS:-a b}
for which in $TRAIN_AGENTS; do
    case "$which" in
        a) AGENT_FLAGS+=(--agent "name=$AGENT_A,pretrain=$MODEL_A") ;;
        b) AGENT_FLAGS+=(--agent "name=$AGENT_B,pretrain=$MODEL_B") ;;
        *) echo "train_table1.sh: TRAIN_AGENTS must list a and/or b, got '$TRAIN_AGENTS'" >&2; exit 2 ;;
    esac
done
if [[ ${#AGENT_FLAGS[@]} -ne 4 ]]; then
    case "$METHOD" in
        gspo|gspo_x2|grpo) ;;
        *) echo "train_table1.sh: method '$METHOD' trains both agents together; TRAIN_AGENTS='$TRAIN_AGENTS'" \
                "is for the single-agent methods (gspo, gspo_x2, grpo)" >&2; exit 2 ;;
    esac
fi

DATA_DIR=${DATA_DIR:-${HACPO_CACHE_DIR:-.cache}/reproduce/data}
SAVE_PATH=${SAVE_PATH:-runs/table1/$PAIR/$METHOD}
if [[ "$SCALE" == paper ]]; then
    PROMPT_DATA=${PROMPT_DATA:-$DATA_DIR/math_train.jsonl}
    EVAL_DATA=${EVAL_DATA:-$DATA_DIR/math500.jsonl}
    GENERATE_MAX_LEN=${GENERATE_MAX_LEN:-4096}
    SCALE_FLAGS=(--rollout_backend vllm --vllm_num_engines 2 --vllm_tensor_parallel_size 1
                 --actor_num_gpus_per_node 2 --reward_num_workers 8
                 --rollout_batch_size 128 --train_batch_size 512 --micro_train_batch_size 4 --prompt_max_len 1024
                 --zero_stage 3 --bf16 --gradient_checkpointing --attn_implementation flash_attention_2)
else
    PROMPT_DATA=${PROMPT_DATA:-$DATA_DIR/champ_small.jsonl}
    EVAL_DATA=${EVAL_DATA:-$DATA_DIR/champ_small.jsonl}
    GENERATE_MAX_LEN=${GENERATE_MAX_LEN:-8}
    SCALE_FLAGS=(--no_ray --rollout_backend hf --reward_num_workers 0
                 --rollout_batch_size 1 --train_batch_size 2 --micro_train_batch_size 2 --prompt_max_len 112
                 --zero_stage 0 --max_steps 2 --no_progress_bar --no_final_checkpoint)
fi

# the project's Python (scripts/python_env.sh: HACPO_PYTHON / HACPO_VENV, an environment with the project, .venv)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/python_env.sh"
hacpo_python || exit

set -x
"$PY" -m openrlhf_hacpo.cli.train_hacpo \
   "${AGENT_FLAGS[@]}" \
   "${METHOD_FLAGS[@]}" \
   "${SCALE_FLAGS[@]}" \
   --prompt_data "$PROMPT_DATA" \
   --input_key input \
   --label_key label \
   --apply_chat_template \
   --reward_fn boxed_exact \
   --drop_long_prompts \
   --generate_max_len "$GENERATE_MAX_LEN" \
   --temperature 1.0 \
   --eos_policy text \
   --actor_learning_rate 1e-6 \
   --max_norm 1.0 \
   --init_kl_coef 0.001 \
   --num_episodes 1 \
   --eval_data "$EVAL_DATA" \
   --eval_steps 3 \
   --eval_before_training \
   --eval_generate_max_len "$GENERATE_MAX_LEN" \
   --save_path "$SAVE_PATH" \
   --save_steps 10 \
   --logging_steps 1 \
   --use_tensorboard "$SAVE_PATH/tensorboard" \
   --seed 42 \
   "$@"
