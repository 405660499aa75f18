#!/usr/bin/env bash
# The first thing to run on a new GPU cluster: the whole GPU stack (Ray, DeepSpeed, a vLLM engine, NCCL weight sync,
# checkpoints, resume) on one tiny zoo agent, in a few minutes, with nothing downloaded.
#
#   bash examples/scripts/smoke_2gpu.sh                 # needs 2 GPUs and the GPU install of README / docs/gpu.md
#   AGENT=qwenM bash examples/scripts/smoke_2gpu.sh     # another zoo agent (python -m openrlhf_hacpo.zoo list)
#   bash examples/scripts/smoke_3gpu_zero3.sh           # the Table 1 layout: ZeRO-3 over 2 ranks, KL reference,
#                                                       # gradient checkpointing (3 GPUs; this script, other flags)
#
# 1. builds the agent and the arithmetic prompts (CPU, cached under .cache/). The default agent, llama32, is the
#    zoo's llamaS with 2 heads of 32 (vLLM's GPU attention backends take heads >= 32 in every dtype; the zoo's own
#    agents have heads of 16 or 24, which only FlashAttention runs, and only in bf16/fp16);
# 2. trains 2 steps: one policy GPU (DeepSpeed ZeRO-2, bf16) and one vLLM engine GPU, weights broadcast over NCCL
#    after every update, a joint checkpoint after each step;
# 3. resumes from the step-2 checkpoint for one more step (the engine is synced with the restored weights first);
# 4. evaluates the saved agent greedily and checks that metrics.jsonl holds steps 1, 2, 3.
# Outputs go to $OUT (default runs/$SMOKE, emptied first). Settings read from the environment: SMOKE (the name in
# messages and the default output folder), SMOKE_GPUS (GPUs needed, 2), SMOKE_FLAGS (the layout's trainer flags);
# arguments are passed to both training commands. Python (scripts/python_env.sh): HACPO_PYTHON or PYTHON or HACPO_VENV
# when set, else an active environment or python3 on PATH with the GPU install (the project, torch, transformers,
# DeepSpeed, Ray, vLLM), else the repository's .venv when it exists; nothing is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source "$ROOT/scripts/python_env.sh"
hacpo_python --var PYTHON --no-install openrlhf_hacpo torch transformers deepspeed ray vllm || exit
SMOKE=${SMOKE:-smoke_2gpu}
SMOKE_GPUS=${SMOKE_GPUS:-2}
read -r -a LAYOUT <<< "${SMOKE_FLAGS:---actor_num_gpus_per_node 1 --zero_stage 2 --init_kl_coef 0}"
AGENT=${AGENT:-llama32}
OUT=${OUT:-$ROOT/runs/$SMOKE}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt "$SMOKE_GPUS" ]; then
    echo "$SMOKE: needs $SMOKE_GPUS GPUs, torch sees $gpus" >&2
    exit 1
fi

# 1. the agent and the prompts
read -r AGENT_PATH TRAIN EVAL < <("$PY" - "$AGENT" <<'PY'
import sys

from openrlhf_hacpo.zoo import build_zoo, get_preset
from openrlhf_hacpo.zoo.job import export_task_data
from openrlhf_hacpo.zoo.models import ModelSpec
from openrlhf_hacpo.zoo.presets import AGENTS, resolve_agents

name = sys.argv[1]
if name == "llama32":
    # llamaS's recipe (char tokenizer, warm start) with 2 heads of 32 instead of 4 of 16
    specs = [AGENTS["llamaS"].replace(name="llama32", model=ModelSpec("llama", hidden_size=64, num_layers=2,
                                                                      num_heads=2))]
else:
    specs = resolve_agents([name])
paths = build_zoo(specs, None, progress=True, jobs=1)
data = export_task_data(get_preset("model").rl)
print(paths[name], data["train"], data["eval"])
PY
)
rm -rf "$OUT"

train() {
    "$PY" -m openrlhf_hacpo.cli.train_hacpo \
        --agent "name=$AGENT,pretrain=$AGENT_PATH" \
        --prompt_data "$TRAIN" --input_key input --label_key label --apply_chat_template \
        --prompt_max_len 64 --generate_max_len 40 --reward_fn arithmetic --reward_num_workers 0 \
        --rollout_backend vllm --vllm_num_engines 1 --device cuda \
        --n_samples_per_prompt 8 --rollout_batch_size 16 --train_batch_size 128 --micro_train_batch_size 32 \
        --algorithm gspo --actor_learning_rate 3e-4 --bf16 "${LAYOUT[@]}" \
        --save_path "$OUT" --save_steps 1 --max_ckpt_num 2 --logging_steps 1 --no_progress_bar --seed 0 "$@"
}

# 2. two steps, 3. one more after --resume
train --max_steps 2 --no_save_hf "$@"
train --max_steps 3 --resume "$@"

# 4. greedy evaluation of the saved agent, and the step records
"$PY" -m openrlhf_hacpo.cli.tiny evaluate --preset model --run "$OUT" --max_problems 200
"$PY" - "$OUT" "$SMOKE" <<'PY'
import sys

from openrlhf_hacpo.utils.jsonl import read_records

out, smoke = sys.argv[1], sys.argv[2]
records = read_records(f"{out}/metrics.jsonl")
steps = sorted({record["step"] for record in records})
if steps != [1, 2, 3]:
    sys.exit(f"{smoke}: metrics.jsonl holds steps {steps}, expected [1, 2, 3]")
for record in sorted(records, key=lambda r: (r["step"], r.get("agent", ""))):
    numbers = {k: record[k] for k in ("reward/mean", "loss", "updates") if isinstance(record.get(k), (int, float))}
    print(f"{smoke}: step {record['step']} agent {record.get('agent')}: "
          + ", ".join(f"{k} {v:.4g}" for k, v in numbers.items()))
print(f"{smoke}: steps 1-3 logged, resume and evaluation done")
PY
