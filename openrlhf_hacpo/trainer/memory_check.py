"""The launch-time memory check: the GPU's size (``--gpu_memory_gb``, else ``nvidia-smi``'s smallest GPU, which
creates no CUDA context) and the run's :class:`~openrlhf_hacpo.trainer.memory_plan.MemoryPlan`, printed before any
worker starts and refused when a GPU cannot hold its share, unless ``--no_memory_check``."""
from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openrlhf_hacpo.actors.agent_plan import AgentPlan
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.trainer.memory_layout import agent_layouts
from openrlhf_hacpo.trainer.memory_plan import MemoryPlan, plan_run
from openrlhf_hacpo.trainer.memory_sizes import GIB

__all__ = ["detect_gpu_bytes", "gpu_bytes_of", "launch_memory_plan"]


def detect_gpu_bytes(run: Callable[..., Any] = subprocess.run) -> int | None:
    """The smallest GPU of this node by ``nvidia-smi`` (no CUDA context is created), or ``None`` without one."""
    try:
        done = run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True, timeout=30)
        sizes = [int(float(line)) for line in done.stdout.split() if line.strip()]
    except (OSError, ValueError, subprocess.SubprocessError):  # no nvidia-smi (FileNotFoundError), no driver
        return None
    return min(sizes) * 2**20 if done.returncode == 0 and sizes else None


def gpu_bytes_of(cfg: TrainConfig, detect: Callable[[], int | None] = detect_gpu_bytes) -> int | None:
    """``--gpu_memory_gb`` (GiB) when given, else :func:`detect_gpu_bytes`."""
    given = cfg.compute.gpu_memory_gb
    return int(given * GIB) if given else detect()


def launch_memory_plan(cfg: TrainConfig, plans: Sequence[AgentPlan], model_configs: Mapping[str, Any],
                       log: Callable[[str], None] = print,
                       detect: Callable[[], int | None] = detect_gpu_bytes) -> MemoryPlan | None:
    """Print the memory plan of the agents' GPU ``plans``; raise its refusal (:meth:`MemoryPlan.check`) unless
    ``--no_memory_check``. Without a known GPU size the plan is printed with a note and nothing is refused; a model
    the plan cannot count (a mixture of experts, a config without the usual size fields) is named and the plan
    skipped (returns None)."""
    try:
        layouts = agent_layouts(cfg, plans, model_configs)
    except ValueError as err:
        log(f"memory plan skipped: {err}")
        return None
    plan = plan_run(layouts, gpu_bytes_of(cfg, detect), shared_gpu=not cfg.cluster.use_ray)
    log(plan.format_table())
    if plan.gpu_bytes is None:
        log("memory plan: GPU size unknown (no nvidia-smi on this node); pass --gpu_memory_gb to check the layout")
    elif cfg.compute.memory_check:
        plan.check()
    elif not plan.fits:
        log("memory plan: the layout does not fit by this estimate; launching anyway (--no_memory_check)")
    return plan
