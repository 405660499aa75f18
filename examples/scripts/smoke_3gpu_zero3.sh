#!/usr/bin/env bash
# The smoke run of examples/scripts/smoke_2gpu.sh in the Table 1 layout (examples/scripts/train_table1.sh): DeepSpeed
# ZeRO-3 over 2 data-parallel policy ranks with gradient checkpointing, a KL reference model on rank 0's GPU
# (--init_kl_coef 0.001), and one vLLM engine GPU fed by NCCL broadcast of bucket-by-bucket ZeRO-3 gathers.
#
#   bash examples/scripts/smoke_3gpu_zero3.sh               # needs 3 GPUs; AGENT=... and OUT=... as for smoke_2gpu.sh
#
# Steps and checks are smoke_2gpu.sh's: 2 steps with a checkpoint after each, --resume for a third, greedy
# evaluation, metrics.jsonl holding steps 1-3. train_batch_size 128 over 2 ranks of micro-batch 32: 2 micro-batches
# of gradient accumulation per update on each rank.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SMOKE=${SMOKE:-smoke_3gpu_zero3} SMOKE_GPUS=3 \
SMOKE_FLAGS="--actor_num_gpus_per_node 2 --zero_stage 3 --gradient_checkpointing --init_kl_coef 0.001" \
    exec bash "$HERE/smoke_2gpu.sh" "$@"
