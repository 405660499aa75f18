#!/usr/bin/env bash
# Baseline for the paper's heterogeneous-size pair: Qwen3-1.7B-Base + Qwen3-4B-Base, 8 GPUs on one node.
#
# GSPO baseline: each agent trains alone on its own 8 rollouts per prompt (2 independent runs in one job, same
# GPUs and settings as the HACPO launcher; 1024 own rows per agent and step -> 2 updates of 512 rows).
set -x

MODEL_A=${MODEL_A:-Qwen/Qwen3-1.7B-Base}
MODEL_B=${MODEL_B:-Qwen/Qwen3-4B-Base}
PROMPT_DATA=${PROMPT_DATA:-data/math/train.jsonl}   # records with "input" (chat messages or text) and "label"
EVAL_DATA=${EVAL_DATA:-data/math500/test.jsonl}
SAVE_PATH=${SAVE_PATH:-runs/gspo_qwen3_1.7b_4b}

python3 -m openrlhf_hacpo.cli.train_hacpo \
   --agent name=qwen3_1.7b,pretrain=${MODEL_A} \
   --agent name=qwen3_4b,pretrain=${MODEL_B} \
   --algorithm gspo \
   --prompt_data ${PROMPT_DATA} \
   --input_key input \
   --label_key label \
   --apply_chat_template \
   --reward_fn boxed_math \
   --reward_num_workers 8 \
   --rollout_backend vllm \
   --vllm_num_engines 2 \
   --vllm_tensor_parallel_size 1 \
   --vllm_gpu_memory_utilization 0.6 \
   --actor_num_gpus_per_node 2 \
   --n_samples_per_prompt 8 \
   --rollout_batch_size 128 \
   --train_batch_size 512 \
   --micro_train_batch_size 4 \
   --prompt_max_len 1024 \
   --generate_max_len 4096 \
   --temperature 1.0 \
   --actor_learning_rate 1e-6 \
   --max_norm 1.0 \
   --init_kl_coef 0.001 \
   --eps_clip_low 3e-4 \
   --eps_clip_high 4e-4 \
   --capability_window 5 \
   --num_episodes 1 \
   --zero_stage 3 \
   --bf16 \
   --gradient_checkpointing \
   --attn_implementation flash_attention_2 \
   --eval_data ${EVAL_DATA} \
   --eval_steps 3 \
   --eval_generate_max_len 4096 \
   --save_path ${SAVE_PATH} \
   --save_steps 10 \
   --logging_steps 1 \
   --use_tensorboard ${SAVE_PATH}/tensorboard \
   --seed 42 \
   "$@"
