"""Print the memory plan of a training command without launching it (no GPU, Ray or model weights needed: only
each agent's ``config.json``, from its folder or the Hugging Face hub).

    python -m openrlhf_hacpo.cli.memory_plan --agent name=q8,pretrain=Qwen/Qwen3-8B --agent ... \\
        --prompt_data data/train.jsonl --zero_stage 3 --actor_num_gpus_per_node 4 --gradient_checkpointing \\
        --bf16 --rollout_backend vllm --vllm_num_engines 2 --gpu_memory_gb 79.6

Takes exactly the flags of ``train_hacpo`` (:func:`openrlhf_hacpo.cli.train_hacpo.build_config`); the GPU size is
``--gpu_memory_gb`` (GiB) or, without it, this machine's smallest GPU by ``nvidia-smi``. Prints the table of
:meth:`~openrlhf_hacpo.trainer.memory_plan.MemoryPlan.format_table`, then either that every agent fits or the
refusal ``train_hacpo`` would give (with the options that fit). Exit status: 0 when the layout fits (or the GPU size
is unknown), 1 when it does not, 2 on a bad command line or a model config that cannot be read.
"""
from __future__ import annotations

import sys
from typing import Sequence

from openrlhf_hacpo.cli.train_hacpo import build_config

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.trainer.memory_check import gpu_bytes_of
    from openrlhf_hacpo.trainer.memory_layout import agent_layouts
    from openrlhf_hacpo.trainer.memory_plan import plan_run
    from openrlhf_hacpo.trainer.preflight import load_model_configs

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = build_config(argv)
        layouts = agent_layouts(cfg, plan_agents(cfg, on_gpu=True), load_model_configs(cfg))
        plan = plan_run(layouts, gpu_bytes_of(cfg), shared_gpu=not cfg.cluster.use_ray)
    except (ValueError, OSError) as err:  # bad settings; a model folder or hub id without a readable config
        print(f"memory_plan: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(plan.format_table())
    if plan.gpu_bytes is None:
        print("memory plan: GPU size unknown (no nvidia-smi here); pass --gpu_memory_gb to check the layout")
        return 0
    try:
        plan.check()
    except ValueError as err:
        print(err)
        return 1
    print("memory plan: every agent fits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
