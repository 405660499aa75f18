r"""The bytes one agent needs on each of its GPUs (and in host memory), phase by phase, from its
:class:`~openrlhf_hacpo.trainer.memory_layout.AgentLayout`: the memory plan's formulas, one
:class:`GpuRow` per GPU (:mod:`openrlhf_hacpo.trainer.memory_plan` adds the agents up and checks them against the
GPU's size before any worker starts).

This module only does arithmetic: no CUDA calls, no Ray. The constants are in
:mod:`openrlhf_hacpo.trainer.memory_sizes`. Notation, per agent: :math:`P` parameters, :math:`P_t` trainable
parameters (:math:`P`, or the LoRA adapters' count), :math:`w` bytes per weight (2 in bf16, 4 in fp32), :math:`d`
data-parallel ranks, ZeRO stage :math:`z`, :math:`m` rows per micro-batch, :math:`s` = prompt_max_len +
generate_max_len tokens per row, :math:`r` = generate_max_len, :math:`H` hidden size, :math:`L` layers, :math:`V`
vocabulary, :math:`G` the GPU's bytes. Sharding over the ranks follows ZeRO (:math:`[\cdot]` is 1 when true, else 0;
divisions round up):

.. math::

    \text{weights} = \frac{w P}{d^{[z=3]}}, \quad \text{master} = \frac{4 P_t}{d^{[z\ge1]}}\,[\text{bf16} \lor
    z \in \{1, 2\} \lor (z = 3 \land \text{adam\_offload})], \quad \text{optimizer} = \frac{8 P_t}{d^{[z\ge1]}}

(with LoRA the weights are the frozen base and the adapters, :math:`w (P + P_t)`, and :math:`P_t` counts only
the adapters). Gradients are counted as the buffers DeepSpeed 0.19.6 holds (``runtime/zero/stage_1_and_2.py``,
``runtime/zero/stage3.py``, with the project's ``contiguous_gradients`` on and ``overlap_comm`` off), in two
phases of an update: the **backward** pass of the last micro-batch (with the activations) and the **optimizer
step** (without them). :math:`g = w P_t / d^{[z=2]}` is a rank's gradient partition, :math:`a` the gradient
accumulation steps (``train_batch_size / (micro_train_batch_size · d)``), :math:`B` the reduce bucket's elements
(:data:`REDUCE_BUCKET_ELEMENTS`), :math:`E` the largest trainable parameter's elements:

* ZeRO-1/2: the backward pass fills the IPG bucket (``setup_buckets``: ``torch.empty(reduce_bucket_size)`` in the
  model dtype, :math:`w B`; freed at the backward epilogue) and copies the rank's gradients into a new partition
  (``copy_grads_in_partition``: ``grads_in_partition``, :math:`g`); with :math:`a > 1` the partition of the earlier
  micro-batches is kept to add the new one into (``all_grad_tensors``): backward :math:`g (1 + [a > 1]) + w B`. The
  step (``step()``) flattens the partition into a new tensor (``flatten(averaged_gradients)``), converts it to
  fp32 (a third tensor in bf16), frees the partition and runs AdamW, whose denominator is one more fp32
  temporary (:data:`ADAM_STEP_TEMP_BYTES`): step :math:`\max(2w + 4[w \ne 4],\ 4 + 4)\,P_t / d`, i.e.
  :math:`8 P_t / d` in fp32 and bf16 alike.
* ZeRO-3: the bucket (:math:`w B`, allocated at initialisation) and the flat gradient partition
  (``grad_partitions_flat_buffer``, :math:`w P_t / d`) are kept all the time; the step updates one sub-group at a
  time (``_create_fp16_sub_groups``: parameters in order until their partitions reach :math:`S`,
  :data:`SUB_GROUP_ELEMENTS`) and adds its flattened fp32 copy (``_prepare_fp32_grad_for_sub_group``) and AdamW's
  temporary, :math:`8 \min(P_t / d,\ S + E / d)`.
* ``adam_offload``: gradients go from the bucket straight to host memory; the device keeps the bucket during the
  backward pass and ``temp_grad_buffer_for_gpu_offload`` (:math:`w E`, ZeRO-1/2). The host holds, besides the
  fp32 master weights, moments and fp32 gradient partition (:data:`OFFLOADED_GRADIENT_BYTES`), under ZeRO-1/2 the
  buffer the updated weights are copied back through (``param_buffer_of_bit16_for_cpu_offload_groups``,
  :math:`w P_t / d`), the accumulated gradients with :math:`a > 1` (``accumulated_grads_in_cpu``, :math:`w P_t /
  d`) and ``temp_grad_buffer_for_cpu_offload`` (:math:`w E`); under ZeRO-3 the flat gradient partition
  (:math:`w P_t / d`).
* ZeRO-0: the gradients :math:`w P_t`, and at the step AdamW's temporary :math:`4 P_t` beside them.

The backward count adds the activations of the whole micro-batch to every gradient buffer of the pass, an upper
bound: the activations are freed layer by layer while the bucket fills.

Activations of one micro-batch of :math:`T = m s` tokens, with :data:`ACTIVATION_FACTOR` :math:`k`
values per token, hidden unit and layer kept for the backward pass:

.. math::

    \text{activations} = \begin{cases} k\,T H L w & \text{no checkpointing} \\
                                      T H (L - 1) w + k\,T H w & \text{gradient checkpointing (the other layers'
                                      inputs + one layer recomputed)}
                         \end{cases}

plus, with ``attn_implementation=eager``, the attention probabilities :math:`2 m n_h s^2 w` per layer kept (or one
layer's under checkpointing). The log-prob head (``--logprob_path``): ``logits`` holds the response positions'
logits in the model dtype and an fp32 tensor of the same shape, :math:`m r V (w + 4)`; ``fused`` one tile of the
Triton kernel, :math:`c V_c w + c H (4 + w)` with :math:`c = \min(C, m r)` (``hacpo_kernels.fused_linear_logprobs``:
:math:`C` = 2048 tokens, :math:`V_c` = 16384 vocabulary entries). Under ZeRO-3 each rank also holds the gathered
weights in flight, :math:`w (2 P_\text{layer} + V H)` (two decoder layers, one being computed and one prefetched,
and the embedding / LM head).

Where each part sits:

* policy rank :math:`i` on the agent's GPU :math:`i`; the reference model (``--init_kl_coef`` > 0), :math:`w P`
  whole, on GPU 0, or in host memory with ``ref_reward_offload``, or none with LoRA (the base model with the
  adapters disabled is the reference);
* ``adam_offload``: master weights, optimizer states and DeepSpeed's fp32 gradient partition (:math:`16 P_t / d`)
  go to host memory; ``param_offload`` (ZeRO-3 only): the weights (:math:`w P / d`) go to host memory, the gathered
  weights in flight stay;
* vLLM engines on dedicated GPUs: :math:`w P / t` weights per tensor-parallel shard, and vLLM takes the utilisation
  :math:`u G` of the GPU whatever the weights, the rest being KV cache; colocated (``--colocate_all_models``) engines
  take :math:`u G` of the GPUs they share with the policy while they generate, and with sleep mode (the colocated
  default) nothing but their process's CUDA context while the policy trains, their weights then in host memory.

A policy GPU's total is its peak phase: the backward pass (``train``: states + its gradient buffers +
activations + log-prob head + reference + an awake engine), the optimizer step (``step``: states + its gradient
buffers + reference + an awake engine) or, colocated, generation (the states kept between updates, or none with
``deepspeed_enable_sleep``, + reference + the engine). The
policy process's tensors are scaled by :data:`ALLOCATOR_OVERHEAD` and its CUDA context adds
:data:`CUDA_CONTEXT_BYTES`, as does a sleeping engine's (an awake engine's context is inside its budget). Without
Ray (``--no_ray``) every agent's worker shares one process and one GPU, so their GPU-0 rows add up.

Not counted: the HF backend's generation KV cache, no-gradient scoring passes (smaller than a training
micro-batch), DeepSpeed's all-gather buckets and NCCL buffers beyond the overhead factor, ZeRO-1's gradients of
the other ranks' partitions during its backward pass (counted as the unsharded :math:`w P_t`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hacpo_kernels.fused_linear_logprobs import DEFAULT_CHUNK_SIZE, DEFAULT_VOCAB_CHUNK_SIZE
from openrlhf_hacpo.trainer.memory_layout import AgentLayout
from openrlhf_hacpo.trainer.memory_sizes import (
    ACTIVATION_FACTOR,
    ADAM_BYTES,
    ADAM_STEP_TEMP_BYTES,
    ALLOCATOR_OVERHEAD,
    CUDA_CONTEXT_BYTES,
    MASTER_BYTES,
    OFFLOADED_GRADIENT_BYTES,
    SUB_GROUP_ELEMENTS,
)

__all__ = ["COMPONENTS", "GpuRow", "PolicyPhases", "plan_agent", "policy_phases"]


def _ceil(a: float, b: int) -> int:
    return int(math.ceil(a / b))



COMPONENTS = ("weights", "master", "gradients", "bucket", "optimizer", "activations", "logprobs", "gathered",
              "reference", "engine")


@dataclass(frozen=True)
class GpuRow:
    """One GPU of one agent: its bytes per component (as placed at the peak phase), the total including the
    allocator overhead and CUDA contexts, the host memory its processes hold, and whether it fits ``gpu_bytes``
    (``None``: GPU size unknown)."""

    agent: str
    gpu: int
    role: str
    weights: int = 0
    master: int = 0
    gradients: int = 0
    bucket: int = 0
    optimizer: int = 0
    activations: int = 0
    logprobs: int = 0
    gathered: int = 0
    reference: int = 0
    engine: int = 0
    total: int = 0
    host: int = 0
    phase: str = "train"
    gpu_bytes: int | None = None

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_bytes is None else self.total <= self.gpu_bytes

    @property
    def allocated(self) -> int:
        """The policy process's tensor bytes at the peak phase, without overhead and context: what
        ``torch.cuda.max_memory_allocated`` of the policy rank measures."""
        return sum(getattr(self, c) for c in COMPONENTS if c != "engine")


def _activation_bytes(lay: AgentLayout) -> int:
    shape, w = lay.shape, lay.weight_bytes
    seq = lay.prompt_len + lay.response_len
    tokens = lay.micro_batch * seq
    one_layer = ACTIVATION_FACTOR * tokens * shape.hidden * w
    if lay.attn_implementation == "eager":
        one_layer += 2 * lay.micro_batch * shape.heads * seq * seq * w
    if lay.gradient_checkpointing:  # the recomputed layer's own input is among its k values
        return tokens * shape.hidden * (shape.layers - 1) * w + one_layer
    return shape.layers * one_layer


def _logprob_bytes(lay: AgentLayout) -> int:
    shape, w = lay.shape, lay.weight_bytes
    response_tokens = lay.micro_batch * lay.response_len
    if lay.logprob_path == "logits":
        return response_tokens * shape.vocab * (w + 4)
    chunk = min(DEFAULT_CHUNK_SIZE, response_tokens)
    return chunk * min(DEFAULT_VOCAB_CHUNK_SIZE, shape.vocab) * w + chunk * shape.hidden * (4 + w)


@dataclass(frozen=True)
class PolicyPhases:
    """One policy rank's device bytes per phase (each a dict of weights, master, gradients, bucket, optimizer and
    gathered) and its host bytes."""

    kept: dict[str, int]
    """Between updates (what generation sits next to)."""
    backward: dict[str, int]
    """During the backward pass of a micro-batch (the activations come on top)."""
    step: dict[str, int]
    """During the optimizer step."""
    host: int


_STATE_KEYS = ("weights", "master", "gradients", "bucket", "optimizer", "gathered")


def policy_phases(lay: AgentLayout) -> PolicyPhases:
    """Per policy rank: bytes of the ZeRO states and gradient buffers on the GPU in each phase, and host bytes of
    the offloaded ones (formulas in the module's docstring)."""
    P, Pt, w, d, z = lay.shape.parameters(), lay.trainable, lay.weight_bytes, lay.dp, lay.zero_stage
    frozen = P if lay.lora_rank > 0 else 0  # LoRA: the whole base model, frozen, plus the adapters
    weights = _ceil(w * (frozen + Pt), d if z == 3 else 1)
    fp32_copy = lay.bf16 or z in (1, 2) or (z == 3 and lay.adam_offload)  # see MASTER_BYTES
    master = _ceil(MASTER_BYTES * Pt, d if z >= 1 else 1) if fp32_copy else 0
    optimizer = _ceil(ADAM_BYTES * Pt, d if z >= 1 else 1)
    shard = _ceil(Pt, d if z >= 1 else 1)  # trainable elements a rank steps
    partition = w * (shard if z >= 2 else Pt)  # g: the rank's gradient partition (ZeRO-0/1: every gradient)
    bucket = w * lay.bucket_elements if z >= 1 else 0
    accumulated = lay.accumulation_steps > 1
    largest = w * lay.largest_trainable
    host = 0
    if z == 0:
        kept_grads, backward_grads, step_grads = 0, partition, partition + ADAM_STEP_TEMP_BYTES * Pt
        kept_bucket = 0
    elif lay.adam_offload and z in (1, 2):
        kept_grads = backward_grads = step_grads = largest  # temp_grad_buffer_for_gpu_offload
        kept_bucket = 0
        host += w * shard * (1 + accumulated) + largest  # bit16 copy-back buffer, accumulated grads, CPU temp
    elif lay.adam_offload:  # ZeRO-3: the flat gradient partition lives in host memory
        kept_grads = backward_grads = step_grads = 0
        kept_bucket = bucket
        host += w * shard
    elif z in (1, 2):
        kept_grads, kept_bucket = 0, 0
        backward_grads = partition * (1 + accumulated)
        step_grads = max(2 * w + (4 if w != 4 else 0), 4 + ADAM_STEP_TEMP_BYTES) * shard
    else:  # ZeRO-3 on the device
        kept_grads = backward_grads = w * shard
        sub_group = min(shard, SUB_GROUP_ELEMENTS + _ceil(lay.largest_trainable, d))
        step_grads = kept_grads + (4 + ADAM_STEP_TEMP_BYTES) * sub_group
        kept_bucket = bucket
    if lay.adam_offload:
        host += master + optimizer + _ceil(OFFLOADED_GRADIENT_BYTES * Pt, d if z >= 1 else 1)
        master = optimizer = 0
    if lay.param_offload:
        host += weights
        weights = 0
    gathered = 0
    if z == 3:
        gathered = w * (2 * lay.shape.layer_parameters() + lay.shape.vocab * lay.shape.hidden)
    held = {"weights": weights, "master": master, "optimizer": optimizer, "gathered": gathered}
    return PolicyPhases(kept={**held, "gradients": kept_grads, "bucket": kept_bucket},
                        backward={**held, "gradients": backward_grads, "bucket": bucket},
                        step={**held, "gradients": step_grads, "bucket": kept_bucket}, host=host)


def plan_agent(lay: AgentLayout, gpu_bytes: int | None) -> list[GpuRow]:
    """The rows of one agent: its policy GPUs (colocated engines on the first ``engines x tp`` of them), then its
    dedicated engine GPUs."""
    P, w = lay.shape.parameters(), lay.weight_bytes
    parts = policy_phases(lay)
    activations, logprobs = _activation_bytes(lay), _logprob_bytes(lay)
    reference_bytes = w * P if lay.has_reference else 0
    engine_gpus = lay.engines * lay.tensor_parallel
    engine_weights = _ceil(w * P, lay.tensor_parallel)
    engine_budget = int(lay.engine_utilization * gpu_bytes) if gpu_bytes is not None else engine_weights
    none = dict.fromkeys(_STATE_KEYS, 0)
    rows = []
    for gpu in range(lay.policy_gpus):
        has_policy = gpu < lay.dp
        has_engine = lay.colocated and gpu < engine_gpus
        ref_here = has_policy and gpu == 0 and reference_bytes > 0 and not lay.ref_reward_offload
        role = " + ".join(["policy"] * has_policy + ["ref"] * ref_here + ["vLLM"] * has_engine)
        host = parts.host if has_policy else 0
        reference = 0
        if has_policy and gpu == 0 and reference_bytes:
            if lay.ref_reward_offload:
                host += reference_bytes
            else:
                reference = reference_bytes
        contexts = CUDA_CONTEXT_BYTES if has_policy else 0  # an engine's own is inside its budget when awake
        awake_engine = engine_budget if has_engine and not lay.engine_sleep else 0
        asleep = CUDA_CONTEXT_BYTES if has_engine and lay.engine_sleep else 0
        phases = []  # (total, phase, parts), the first of equal totals wins
        for phase, states, transient in (("train", parts.backward, activations + logprobs), ("step", parts.step, 0)):
            states = states if has_policy else none
            tensors = sum(states.values()) + reference + (transient if has_policy else 0)
            total = int(tensors * ALLOCATOR_OVERHEAD) + contexts + awake_engine + asleep
            extra = {"activations": activations, "logprobs": logprobs} if has_policy and transient else {}
            phases.append((total, phase, {**states, "reference": reference, "engine": awake_engine, **extra}))
        if has_engine:
            if lay.engine_sleep:
                host += engine_weights
            kept = parts.kept if has_policy and not lay.deepspeed_enable_sleep else none
            generate = int((sum(kept.values()) + reference) * ALLOCATOR_OVERHEAD) + contexts + engine_budget
            phases.append((generate, "generate", {**kept, "reference": reference, "engine": engine_budget}))
            if lay.deepspeed_enable_sleep and has_policy:  # the states wait in host memory during generation
                host += sum(parts.kept.values()) - parts.kept["gathered"]
        if not has_policy:  # an engine's GPU peaks while it generates; an idle one holds nothing
            phases = phases[-1:] if has_engine else phases[:1]
        total, phase, values = max(phases, key=lambda item: item[0])
        rows.append(GpuRow(agent=lay.name, gpu=gpu, role=role or "idle", total=total, host=host, phase=phase,
                           gpu_bytes=gpu_bytes, **values))
    if not lay.colocated:
        for shard in range(engine_gpus):
            total = max(engine_budget, int(engine_weights * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES)
            rows.append(GpuRow(agent=lay.name, gpu=lay.dp + shard, role="vLLM", engine=engine_budget, total=total,
                               phase="generate", gpu_bytes=gpu_bytes))
    return rows


def _engine_fits(lay: AgentLayout, gpu_bytes: int | None) -> bool:
    """An engine needs its weights shard (with the overhead and its context) inside its budget, the rest being KV
    cache; the budget is ``utilization x G``."""
    if gpu_bytes is None:
        return True
    need = int(_ceil(lay.weight_bytes * lay.shape.parameters(), lay.tensor_parallel) * ALLOCATOR_OVERHEAD)
    return lay.engines == 0 or need + CUDA_CONTEXT_BYTES < lay.engine_utilization * gpu_bytes

