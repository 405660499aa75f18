"""The memory plan of a run: every agent's GPU rows together (:class:`MemoryPlan`, :func:`plan_run`), its table, and
the check that refuses a layout that cannot fit, naming the options whose re-planned layout fits
(:func:`fitting_options`).

The rows come from :mod:`openrlhf_hacpo.trainer.memory_rows` (the formulas),
:mod:`openrlhf_hacpo.trainer.memory_check` runs the plan when a GPU run launches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from openrlhf_hacpo.trainer.memory_layout import AgentLayout
from openrlhf_hacpo.trainer.memory_rows import COMPONENTS, GpuRow, _engine_fits, plan_agent
from openrlhf_hacpo.trainer.memory_sizes import ALLOCATOR_OVERHEAD, CUDA_CONTEXT_BYTES, GIB

__all__ = ["LORA_SUGGESTED_RANK", "MemoryPlan", "fitting_options", "plan_run"]

LORA_SUGGESTED_RANK = 64
"""The LoRA rank a refusal tries."""

_HEADERS = {"weights": "weights", "master": "fp32 master", "gradients": "grads", "bucket": "grad bucket",
            "optimizer": "Adam",
            "activations": "activ.", "logprobs": "log-prob head", "gathered": "ZeRO-3 gather",
            "reference": "ref", "engine": "vLLM"}



@dataclass(frozen=True)
class MemoryPlan:
    """The rows of every agent on GPUs of ``gpu_bytes`` (``None``: unknown, nothing is checked). ``shared_gpu``:
    every agent's worker runs in one process on one GPU (``--no_ray``), so their GPU-0 rows add up."""

    layouts: tuple[AgentLayout, ...]
    rows: tuple[GpuRow, ...]
    gpu_bytes: int | None
    shared_gpu: bool = False

    @property
    def shared_total(self) -> int:
        """Without Ray: the agents' GPU-0 tensors together, with the overhead and one CUDA context."""
        allocated = sum(r.allocated for r in self.rows if r.gpu == 0)
        return int(allocated * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES

    def _shared_fits(self) -> bool:
        return not self.shared_gpu or self.gpu_bytes is None or self.shared_total <= self.gpu_bytes

    def agent_rows(self, agent: str) -> list[GpuRow]:
        return [r for r in self.rows if r.agent == agent]

    def agent_fits(self, agent: str) -> bool:
        layout = next(lay for lay in self.layouts if lay.name == agent)
        return all(r.fits is not False for r in self.agent_rows(agent)) and _engine_fits(layout, self.gpu_bytes)

    @property
    def fits(self) -> bool:
        return all(self.agent_fits(lay.name) for lay in self.layouts) and self._shared_fits()

    def peak(self, agent: str) -> GpuRow:
        """The agent's row with the most bytes."""
        return max(self.agent_rows(agent), key=lambda r: r.total)

    def format_table(self) -> str:
        """A fixed-width table in GiB: one line per agent and GPU, then each agent's host memory."""
        size = "unknown (pass --gpu_memory_gb)" if self.gpu_bytes is None else f"{self.gpu_bytes / GIB:.1f} GiB"
        gpu = "?" if self.gpu_bytes is None else f"{self.gpu_bytes / GIB:.1f}"
        head = ["agent", "GPU", "role", *(_HEADERS[c] for c in COMPONENTS), "total", "peak phase", "GPU size", "fits",
                "host"]
        lines = [[r.agent, str(r.gpu), r.role, *(f"{getattr(r, c) / GIB:.1f}" for c in COMPONENTS),
                  f"{r.total / GIB:.1f}", r.phase, gpu, {True: "yes", False: "NO", None: "?"}[r.fits],
                  f"{r.host / GIB:.1f}"] for r in self.rows]
        widths = [max(len(x) for x in col) for col in zip(head, *lines)]
        fmt = lambda cells: "  ".join(c.rjust(n) if i > 2 else c.ljust(n)  # noqa: E731
                                      for i, (c, n) in enumerate(zip(cells, widths)))
        out = [f"memory plan per GPU (GiB; GPU size {size}; totals include x{ALLOCATOR_OVERHEAD:g} allocator "
               f"overhead and {CUDA_CONTEXT_BYTES / GIB:g} GiB CUDA context per process)", fmt(head),
               fmt(["-" * n for n in widths]), *map(fmt, lines)]
        for lay in self.layouts:
            notes = [f"{lay.shape.parameters():,} parameters" + ("" if lay.shape.exact else
                                                                " (dense-decoder estimate)")]
            if lay.lora_rank:
                notes.append(f"LoRA r={lay.lora_rank}: {lay.trainable:,} trainable")
            if not _engine_fits(lay, self.gpu_bytes):
                notes.append("vLLM weights exceed the engine's memory budget")
            notes.append(f"host {sum(r.host for r in self.agent_rows(lay.name)) / GIB:.1f} GiB")
            out.append(f"  {lay.name}: " + "; ".join(notes))
        if self.shared_gpu:
            out.append(f"  all agents in one process on one GPU (no Ray): {self.shared_total / GIB:.1f} GiB")
        return "\n".join(out)

    def check(self) -> None:
        """Raise ``ValueError`` naming each agent that does not fit: its GPU, the GPU's size, the estimate and the
        options whose re-planned layout fits (:func:`fitting_options`)."""
        if self.gpu_bytes is None or self.fits:
            return
        problems = []
        for lay in self.layouts:
            if self.agent_fits(lay.name):
                continue
            row = self.peak(lay.name)
            if not _engine_fits(lay, self.gpu_bytes):
                what = (f"its vLLM engine needs more than its {lay.engine_utilization:g} x {self.gpu_bytes / GIB:.1f} "
                        f"GiB budget for {lay.shape.parameters() / 1e9:.2f} B weights in "
                        f"{'bf16' if lay.bf16 else 'fp32'} at tensor parallelism {lay.tensor_parallel}")
            else:
                what = (f"GPU {row.gpu} ({row.role}) needs an estimated {row.total / GIB:.1f} GiB at its "
                        f"{row.phase} peak, more than the GPU's {self.gpu_bytes / GIB:.1f} GiB")
            options = fitting_options(lay, self.gpu_bytes)
            advice = ("; options that fit, each re-planned: " + " | ".join(options) if options else
                      "; no option tried (gradient checkpointing, larger dp / ZeRO-3, adam_offload, param_offload, "
                      f"LoRA r={LORA_SUGGESTED_RANK}) fits: use larger GPUs or a smaller model")
            problems.append(f"agent {lay.name!r}: {what}{advice}")
        if not self._shared_fits():
            problems.append(f"agents {[lay.name for lay in self.layouts]} share one GPU without Ray and need an "
                            f"estimated {self.shared_total / GIB:.1f} GiB together, more than the GPU's "
                            f"{self.gpu_bytes / GIB:.1f} GiB; use Ray (a GPU per worker) or smaller shares "
                            "(checkpointing, offload, LoRA)")
        raise ValueError("the memory plan refuses this layout (--no_memory_check launches anyway): "
                         + ". ".join(problems))


def _agent_plan(lay: AgentLayout, gpu_bytes: int | None) -> MemoryPlan:
    return MemoryPlan((lay,), tuple(plan_agent(lay, gpu_bytes)), gpu_bytes)


def _candidates(lay: AgentLayout) -> list[tuple[str, str, dict[str, Any]]]:
    """Options in the order the refusal tries them, as (kind, flag text, layout changes); those already on are
    skipped. Kinds: checkpointing, ZeRO-3 / larger dp, adam_offload, param_offload, LoRA, tensor parallelism."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    if not lay.gradient_checkpointing:
        out.append(("checkpointing", "--gradient_checkpointing", {"gradient_checkpointing": True}))
    if lay.zero_stage < 3:
        out.append(("sharding", "zero_stage 3", {"zero_stage": 3}))
    for factor in (2, 4):
        stage = max(lay.zero_stage, 1)
        out.append(("sharding", f"dp_size {lay.dp * factor}" + (f" with zero_stage {stage}"
                                                              if stage != lay.zero_stage else ""),
                    {"dp": lay.dp * factor, "zero_stage": stage}))
        if stage < 3:
            out.append(("sharding", f"dp_size {lay.dp * factor} with zero_stage 3",
                        {"dp": lay.dp * factor, "zero_stage": 3}))
    if not lay.adam_offload:
        out.append(("adam_offload", "--adam_offload", {"adam_offload": True}))
    if not lay.param_offload:
        out.append(("param_offload", "zero_stage 3 with --param_offload" if lay.zero_stage != 3 else
                    "--param_offload", {"zero_stage": 3, "param_offload": True}))
    if lay.lora_rank == 0:
        out.append(("lora", f"--lora_rank {LORA_SUGGESTED_RANK}", {"lora_rank": LORA_SUGGESTED_RANK}))
    if lay.engines:
        out.append(("tensor parallelism", f"vllm_tensor_parallel_size {lay.tensor_parallel * 2}",
                    {"tensor_parallel": lay.tensor_parallel * 2}))
    return out


def fitting_options(lay: AgentLayout, gpu_bytes: int) -> list[str]:
    """Per kind of option (:func:`_candidates`), the first whose re-planned layout fits, each tried alone on the
    agent's layout; when none does, the shortest prefix of the list applied together that fits (one entry, its
    flags joined by `` + ``; larger dp sizes left out, as they need more GPUs). Empty when nothing fits."""
    fitting: dict[str, str] = {}
    for kind, text, change in _candidates(lay):
        if kind not in fitting and _agent_plan(dataclasses.replace(lay, **change), gpu_bytes).fits:
            fitting[kind] = text
    if fitting:
        return list(fitting.values())
    combined, texts = lay, []
    for _, text, change in _candidates(lay):
        if "dp" in change:
            continue
        combined, texts = dataclasses.replace(combined, **change), texts + [text]
        if _agent_plan(combined, gpu_bytes).fits:
            return [" + ".join(texts)]
    return []


def plan_run(layouts: list[AgentLayout], gpu_bytes: int | None, shared_gpu: bool = False) -> MemoryPlan:
    """Every agent's rows on GPUs of ``gpu_bytes`` (``shared_gpu``: see :class:`MemoryPlan`)."""
    return MemoryPlan(tuple(layouts), tuple(r for lay in layouts for r in plan_agent(lay, gpu_bytes)), gpu_bytes,
                      shared_gpu)
