#!/usr/bin/env bash
# One training run of the paper's Table 1: a model pair and a method, 8 GPUs on one node.
#
#   bash examples/scripts/train_table1.sh PAIR METHOD [trainer flags ...]
#
#   PAIR    qwen3_1.7b_4b         Qwen3-1.7B-Base + Qwen3-4B-Base           (α 1, δ 0.2, δ_step 0.025)
#           qwen3_4b_llama3.2_3b  Qwen3-4B-Base + Llama-3.2-3B-Instruct     (α 1, δ 0.2, δ_step 0.025)
#           qwen3_4b_instruct     Qwen3-4B + Qwen3-4B-Instruct              (α 3, δ 0.2, δ_step 0.01)
#   METHOD  hacpo    both agents learn together from all rollouts
#           gspo     each agent alone on its own 8 rollouts per prompt (two independent runs in one job)
#           gspo_x2  each agent alone on 16 rollouts per prompt (HACPO's rollout budget per learner)
#           grpo     each agent alone, GRPO (token ratios, clip [0.8, 1.28])
#           naive    shared rollouts, plain joint-mean advantage, GSPO clip on every row
#
# Agents are named as the paper names the models, so the evaluation command labels their results for the table.
# Every agent gets 4 GPUs: 2 data-parallel policy workers (DeepSpeed ZeRO-3, bf16) and 2 vLLM engines (TP 1). The
# settings follow the official run (spec §3, Table 5): 128 prompts x G rollouts per agent and step, 512 rows per
# update, lr 1e-6, KL 0.001 to the initial policy, HACPO's capability window 5, responses up to 8196 tokens (the paper's
# number for Tables 1, 2, 3 and 7), greedy validation on MATH-500 every 3 steps and before the first one.
# Paths are variables; the defaults read what `python -m openrlhf_hacpo.cli.prepare` writes. Trainer flags after
# METHOD override the script's (argparse keeps the last value), e.g. --max_steps 6.
#
#   MODEL_A / MODEL_B   the pair's models (hub ids or local folders)
#   DATA_DIR            prepared data [${HACPO_CACHE_DIR:-.cache}/reproduce/data]
#   PROMPT_DATA         training prompts [$DATA_DIR/math_train.jsonl]
#   EVAL_DATA           validation prompts [$DATA_DIR/math500.jsonl]
#   SAVE_PATH           run folder [runs/table1/<PAIR>/<METHOD>]
#   GENERATE_MAX_LEN    response length of rollouts and validation [8196]
#
# Start a Ray cluster first (`ray start --head --num-gpus 8`) or let the trainer start a local one.
set -euo pipefail

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
PAIR=$1
METHOD=$2
shift 2

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
    *) echo "train_table1.sh: unknown pair '$PAIR'" >&2; usage ;;
esac

GSPO_CLIP=(--eps_clip_low 3e-4 --eps_clip_high 4e-4)
case "$METHOD" in
    hacpo)   METHOD_FLAGS=(--algorithm hacpo --n_samples_per_prompt 8 "${GSPO_CLIP[@]}" --alpha "$ALPHA"
                           --cross_clip_delta "$DELTA" --cross_clip_step "$DELTA_STEP" --capability_window 5) ;;
    gspo)    METHOD_FLAGS=(--algorithm gspo --n_samples_per_prompt 8 "${GSPO_CLIP[@]}") ;;
    gspo_x2) METHOD_FLAGS=(--algorithm gspo --n_samples_per_prompt 16 "${GSPO_CLIP[@]}") ;;
    grpo)    METHOD_FLAGS=(--algorithm grpo --n_samples_per_prompt 8) ;;
    naive)   METHOD_FLAGS=(--algorithm naive --n_samples_per_prompt 8 "${GSPO_CLIP[@]}") ;;
    *) echo "train_table1.sh: unknown method '$METHOD'" >&2; usage ;;
esac

DATA_DIR=${DATA_DIR:-${HACPO_CACHE_DIR:-.cache}/reproduce/data}
PROMPT_DATA=${PROMPT_DATA:-$DATA_DIR/math_train.jsonl}
EVAL_DATA=${EVAL_DATA:-$DATA_DIR/math500.jsonl}
SAVE_PATH=${SAVE_PATH:-runs/table1/$PAIR/$METHOD}
GENERATE_MAX_LEN=${GENERATE_MAX_LEN:-8196}

set -x
python3 -m openrlhf_hacpo.cli.train_hacpo \
   --agent "name=$AGENT_A,pretrain=$MODEL_A" \
   --agent "name=$AGENT_B,pretrain=$MODEL_B" \
   "${METHOD_FLAGS[@]}" \
   --prompt_data "$PROMPT_DATA" \
   --input_key input \
   --label_key label \
   --apply_chat_template \
   --reward_fn boxed_exact \
   --reward_num_workers 8 \
   --rollout_backend vllm \
   --vllm_num_engines 2 \
   --vllm_tensor_parallel_size 1 \
   --actor_num_gpus_per_node 2 \
   --rollout_batch_size 128 \
   --train_batch_size 512 \
   --micro_train_batch_size 4 \
   --prompt_max_len 1024 \
   --drop_long_prompts \
   --generate_max_len "$GENERATE_MAX_LEN" \
   --temperature 1.0 \
   --eos_policy drop \
   --actor_learning_rate 1e-6 \
   --max_norm 1.0 \
   --init_kl_coef 0.001 \
   --num_episodes 1 \
   --zero_stage 3 \
   --bf16 \
   --gradient_checkpointing \
   --attn_implementation flash_attention_2 \
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
