#!/usr/bin/env bash
# The first thing to run on a new GPU cluster: the whole GPU stack (Ray, DeepSpeed, a vLLM engine, NCCL weight sync,
# checkpoints, resume) on one tiny zoo agent, in a few minutes, with nothing downloaded.
#
#   bash examples/scripts/smoke_2gpu.sh                 # needs 2 GPUs and `pip install -e ".[gpu,test]"`
#   AGENT=qwenS bash examples/scripts/smoke_2gpu.sh     # another zoo agent (python -m openrlhf_hacpo.zoo list)
#
# 1. builds the agent and the arithmetic prompts (CPU, cached under .cache/);
# 2. trains 2 steps: one policy GPU (DeepSpeed ZeRO-2, bf16) and one vLLM engine GPU, weights broadcast over NCCL
#    after every update, a joint checkpoint after each step;
# 3. resumes from the step-2 checkpoint for one more step (the engine is synced with the restored weights first);
# 4. evaluates the saved agent greedily and checks that metrics.jsonl holds steps 1, 2, 3.
# Outputs go to $OUT (default runs/smoke_2gpu, emptied first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY=${PYTHON:-python3}
AGENT=${AGENT:-llamaS}
OUT=${OUT:-$ROOT/runs/smoke_2gpu}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt 2 ]; then
    echo "smoke_2gpu: needs 2 GPUs, torch sees $gpus" >&2
    exit 1
fi

# 1. the agent and the prompts
read -r AGENT_PATH TRAIN EVAL < <("$PY" - "$AGENT" <<'PY'
import sys

from openrlhf_hacpo.zoo.job import export_task_data
from openrlhf_hacpo.zoo import build_zoo, get_preset
from openrlhf_hacpo.zoo.presets import resolve_agents

paths = build_zoo(resolve_agents([sys.argv[1]]), None, progress=True, jobs=1)
data = export_task_data(get_preset("model").rl)
print(paths[sys.argv[1]], data["train"], data["eval"])
PY
)
rm -rf "$OUT"

train() {
    "$PY" -m openrlhf_hacpo.cli.train_hacpo \
        --agent "name=$AGENT,pretrain=$AGENT_PATH" \
        --prompt_data "$TRAIN" --input_key input --label_key label --apply_chat_template \
        --prompt_max_len 64 --generate_max_len 40 --reward_fn arithmetic --reward_num_workers 0 \
        --rollout_backend vllm --vllm_num_engines 1 --actor_num_gpus_per_node 1 --device cuda \
        --n_samples_per_prompt 8 --rollout_batch_size 16 --train_batch_size 128 --micro_train_batch_size 32 \
        --algorithm gspo --init_kl_coef 0 --actor_learning_rate 3e-4 --zero_stage 2 --bf16 \
        --save_path "$OUT" --save_steps 1 --max_ckpt_num 2 --logging_steps 1 --no_progress_bar --seed 0 "$@"
}

# 2. two steps, 3. one more after --resume
train --max_steps 2 --no_save_hf
train --max_steps 3 --resume

# 4. greedy evaluation of the saved agent, and the step records
"$PY" -m openrlhf_hacpo.cli.tiny evaluate --preset model --run "$OUT" --max_problems 200
"$PY" - "$OUT" <<'PY'
import sys

from openrlhf_hacpo.trainer.metrics import read_jsonl

steps = [record["step"] for record in read_jsonl(f"{sys.argv[1]}/metrics.jsonl")]
assert steps == [1, 2, 3], f"metrics.jsonl holds steps {steps}, expected [1, 2, 3]"
print("smoke_2gpu: steps 1-3 logged, resume and evaluation done")
PY
