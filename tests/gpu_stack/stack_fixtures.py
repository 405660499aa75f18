"""Run configurations for the GPU-stack tests' policy workers."""
from __future__ import annotations


def worker_config(pretrain: str, save_path, *extra: str):
    """A one-agent run configuration (fp32 training unless ``--bf16`` is given)."""
    from openrlhf_hacpo.cli.train_hacpo import build_config

    return build_config(["--agent", f"name=qwen,pretrain={pretrain}", "--prompt_data", "unused.jsonl",
                         "--rollout_batch_size", "2", "--n_samples_per_prompt", "2", "--train_batch_size", "4",
                         "--micro_train_batch_size", "4", "--init_kl_coef", "0", "--no_ray",
                         "--save_path", str(save_path), "--no_progress_bar", *extra])


def init_gloo_world() -> None:
    """A one-process gloo world for DeepSpeed (reused when one exists)."""
    import os

    import deepspeed
    import torch

    if torch.distributed.is_initialized():
        assert torch.distributed.get_world_size() == 1
        return
    from openrlhf_hacpo.utils.network import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
