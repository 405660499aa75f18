r"""Bytes every agent needs on each of its GPUs (and in host memory), estimated from the run's layout and the models'
configs before any worker starts, so a layout that cannot fit fails in seconds with the options that would fit.

This module only does arithmetic: no CUDA calls, no Ray (:func:`detect_gpu_bytes` asks ``nvidia-smi``, which
creates no CUDA context). Notation, per agent: :math:`P` parameters, :math:`P_t` trainable parameters (:math:`P`,
or the LoRA adapters' count), :math:`w` bytes per weight (2 in bf16, 4 in fp32), :math:`d` data-parallel ranks,
ZeRO stage :math:`z`, :math:`m` rows per micro-batch, :math:`s` = prompt_max_len + generate_max_len tokens per row,
:math:`r` = generate_max_len, :math:`H` hidden size, :math:`L` layers, :math:`V` vocabulary, :math:`G` the GPU's
bytes. Sharding over the ranks follows ZeRO (:math:`[\cdot]` is 1 when true, else 0; divisions round up):

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

import dataclasses
import math
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hacpo_kernels.fused_linear_logprobs import DEFAULT_CHUNK_SIZE, DEFAULT_VOCAB_CHUNK_SIZE
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.settings import resolve_engine_settings

__all__ = ["ACTIVATION_FACTOR", "ADAM_STEP_TEMP_BYTES", "ALLOCATOR_OVERHEAD", "CUDA_CONTEXT_BYTES", "GIB",
           "LORA_SUGGESTED_RANK", "REDUCE_BUCKET_ELEMENTS", "SUB_GROUP_ELEMENTS",
           "AgentLayout", "GpuRow", "MemoryPlan", "ModelShape", "PolicyPhases", "agent_layouts", "detect_gpu_bytes",
           "fitting_options", "gpu_bytes_of", "launch_memory_plan", "plan_agent", "plan_run", "policy_phases"]

GIB = 2**30

CUDA_CONTEXT_BYTES = 1 * GIB
"""GPU memory a process holds outside PyTorch's allocator: the CUDA context, cuBLAS / NCCL workspaces (0.5-1 GB
on recent GPUs; the upper end is taken). Counted for the policy process and for a sleeping colocated engine (an
awake engine's is inside its ``gpu_memory_utilization`` budget)."""

ALLOCATOR_OVERHEAD = 1.10
"""Factor on the policy process's tensor bytes for the caching allocator's fragmentation and temporaries the plan
does not list (DeepSpeed's gradient buffers are listed: see the module's docstring)."""

REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (elements), which the project's DeepSpeed config does not change: with
``contiguous_gradients`` ZeRO-1/2 allocate a bucket of this many elements in the model dtype at every backward pass
(``DeepSpeedZeroOptimizer.setup_buckets``) and ZeRO-3 one at initialisation (``DeepSpeedZeroOptimizer_Stage3``).
On a GPU the whole bucket is allocated (1 GB in bf16); on a CPU only the pages written are resident, at most
``min(B, P_t)`` elements (:attr:`AgentLayout.bucket_elements` lets a CPU estimate say so)."""

SUB_GROUP_ELEMENTS = 1_000_000_000
"""DeepSpeed's default ``sub_group_size`` (``DeepSpeedZeroConfig``; the project's config does not set it): ZeRO-3
steps a rank's partition in sub-groups of about this many elements, so its step temporaries are per sub-group."""

ADAM_STEP_TEMP_BYTES = 4
"""torch AdamW's fp32 temporary per weight of the group it steps: the denominator ``sqrt(v) / c + eps``
(``torch.optim.adam._multi_tensor_adam``: ``torch._foreach_sqrt(exp_avg_sqs)``, the foreach path of CUDA tensors;
the single-tensor path of CPU tensors briefly holds two)."""

ACTIVATION_FACTOR = 17
"""Values kept per token, hidden unit and layer for the backward pass of a decoder layer with a fused (sdpa /
flash) attention: Korthikanti et al. 2022 count 34 bytes in 16-bit (sbh(34 + 5as/h), whose 5as/h term is the
attention matrix of eager attention), i.e. 17 values."""

MASTER_BYTES = 4
"""DeepSpeed's fp32 master copy of each trainable weight: in bf16 mode always; in fp32 mode too under ZeRO-1/2,
whose optimizer clones the fp32 partition it updates (``single_partition_of_fp32_groups``), and under ZeRO-3 with
``adam_offload`` (the copy on the host); fp32 ZeRO-3 on the device updates the weights' own partition, and fp32
ZeRO-0 has no copy."""

ADAM_BYTES = 8
"""Adam's two fp32 moments per trainable weight."""

OFFLOADED_GRADIENT_BYTES = 4
"""DeepSpeed's fp32 gradient partition that the CPU optimizer steps on, with ``adam_offload``
(``single_partition_of_fp32_groups[i].grad`` under ZeRO-1/2, the sub-groups' ``grad`` buffers under ZeRO-3)."""

LORA_SUGGESTED_RANK = 64
"""The LoRA rank a refusal tries."""

_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_EXACT_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


# ---------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a dense decoder-only LM (Llama, Mistral, Qwen2, Qwen3) that its memory depends on.

    Per layer: attention ``q, k, v, o`` (``H x n_h d``, ``H x n_kv d`` twice, ``n_h d x H``, with biases as the
    family has them), MLP ``gate, up, down`` (``H x I`` twice, ``I x H``), two RMSNorms of ``H`` and, in Qwen3,
    RMSNorms of ``d`` on queries and keys. Plus the embedding ``V x H``, the final norm ``H`` and, untied, the LM
    head ``V x H``.
    """

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: Any, where: str = "model") -> "ModelShape":
        """From a Hugging Face config (``AutoConfig``) of a dense decoder; ``ValueError`` naming ``where`` for a
        mixture-of-experts or a config without the usual size fields."""
        model_type = str(getattr(config, "model_type", "") or "")
        if any(getattr(config, name, None) for name in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise ValueError(f"{where}: the memory plan counts dense decoders only; {model_type!r} is a "
                             "mixture of experts")
        try:
            hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
            values = dict(vocab=int(config.vocab_size), hidden=hidden, layers=int(config.num_hidden_layers),
                          heads=heads, intermediate=int(config.intermediate_size))
        except (AttributeError, TypeError) as err:
            raise ValueError(f"{where}: its config ({model_type!r}) lacks a size field the memory plan needs "
                             f"({err})") from None
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(model_type=model_type, kv_heads=int(kv), head_dim=int(head_dim),
                   tied=bool(getattr(config, "tie_word_embeddings", False)),
                   qkv_bias=model_type == "qwen2" or attention_bias,
                   o_bias=model_type != "qwen2" and attention_bias,
                   mlp_bias=bool(getattr(config, "mlp_bias", False)), qk_norm=model_type == "qwen3", **values)

    @property
    def exact(self) -> bool:
        """Whether :meth:`parameters` is the family's exact count (else the dense-decoder formula, an estimate)."""
        return self.model_type in _EXACT_FAMILIES

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear module of one decoder layer."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_parameters(self) -> int:
        lin = self.linears()
        count = sum(a * b for a, b in lin.values()) + 2 * self.hidden
        if self.qkv_bias:
            count += sum(lin[name][1] for name in ("q_proj", "k_proj", "v_proj"))
        if self.o_bias:
            count += self.hidden
        if self.mlp_bias:
            count += sum(lin[name][1] for name in ("gate_proj", "up_proj", "down_proj"))
        if self.qk_norm:
            count += 2 * self.head_dim
        return count

    def parameters(self) -> int:
        """Every parameter, a tied embedding counted once."""
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_parameters() + self.hidden + head

    def largest_parameter(self) -> int:
        """Elements of the largest parameter tensor: the embedding ``V x H`` or a layer's largest matrix."""
        return max([self.vocab * self.hidden] + [a * b for a, b in self.linears().values()])

    def _lora_targets(self, target_modules: str) -> list[str]:
        lin = self.linears()
        names = list(lin) if target_modules == "all-linear" else [n.strip() for n in target_modules.split(",")
                                                                   if n.strip()]
        unknown = [n for n in names if n not in lin]
        if unknown or not names:
            raise ValueError(f"target_modules={target_modules!r}: the memory plan knows the modules "
                             f"{', '.join(_LINEAR_MODULES)} and all-linear, not {unknown or 'an empty list'}")
        return names

    def largest_lora_parameter(self, rank: int, target_modules: str) -> int:
        """Elements of the largest LoRA matrix: ``rank x max(in, out)`` over the targeted modules."""
        lin = self.linears()
        return max(rank * max(lin[n]) for n in self._lora_targets(target_modules))

    def lora_parameters(self, rank: int, target_modules: str) -> int:
        """LoRA's trainable parameters, ``rank x (in + out)`` per targeted linear module and layer; ``all-linear``
        targets every linear module of the decoder layers (peft's meaning: not the LM head)."""
        lin = self.linears()
        return self.layers * sum(rank * (lin[n][0] + lin[n][1]) for n in self._lora_targets(target_modules))


# ---------------------------------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class AgentLayout:
    """Everything one agent's memory depends on (see the module's docstring for the formulas)."""

    name: str
    shape: ModelShape
    dp: int = 1
    zero_stage: int = 2
    bf16: bool = True
    gradient_checkpointing: bool = False
    micro_batch: int = 8
    prompt_len: int = 1024
    response_len: int = 1024
    logprob_path: str = "fused"
    attn_implementation: str = "sdpa"
    reference: bool = True
    engines: int = 0
    tensor_parallel: int = 1
    colocated: bool = False
    engine_utilization: float = 0.95
    engine_sleep: bool = False
    lora_rank: int = 0
    target_modules: str = "all-linear"
    adam_offload: bool = False
    param_offload: bool = False
    deepspeed_enable_sleep: bool = False
    ref_reward_offload: bool = False
    accumulation_steps: int = 1
    bucket_elements: int = REDUCE_BUCKET_ELEMENTS

    def __post_init__(self) -> None:
        if self.param_offload and self.zero_stage != 3:
            raise ValueError(f"agent {self.name!r}: param_offload needs zero_stage 3, got {self.zero_stage}")
        if self.accumulation_steps < 1 or self.bucket_elements < 0:
            raise ValueError(f"agent {self.name!r}: accumulation_steps must be >= 1 and bucket_elements >= 0, got "
                             f"{self.accumulation_steps} and {self.bucket_elements}")

    @property
    def weight_bytes(self) -> int:
        return 2 if self.bf16 else 4

    @property
    def trainable(self) -> int:
        if self.lora_rank > 0:
            return self.shape.lora_parameters(self.lora_rank, self.target_modules)
        return self.shape.parameters()

    @property
    def largest_trainable(self) -> int:
        """Elements of the largest tensor the optimizer holds (DeepSpeed sizes its offload copy buffers by it)."""
        if self.lora_rank > 0:
            return self.shape.largest_lora_parameter(self.lora_rank, self.target_modules)
        return self.shape.largest_parameter()

    @property
    def policy_gpus(self) -> int:
        return max(self.dp, self.engines * self.tensor_parallel) if self.colocated else self.dp


def _ceil(a: float, b: int) -> int:
    return int(math.ceil(a / b))


def agent_layouts(cfg: TrainConfig, model_configs: Mapping[str, Any]) -> list[AgentLayout]:
    """Each agent's :class:`AgentLayout` from the run's config (inherited settings resolved) and its HF config.

    The memory options (``lora_rank``, ``target_modules``, ``adam_offload``, ``param_offload``,
    ``deepspeed_enable_sleep``, ``ref_reward_offload``) are read from the agent, else the run, when the config has
    them; absent ones count as off."""
    out = []
    for agent in cfg.resolved_agents():
        def option(name: str, default: Any) -> Any:
            value = getattr(agent, name, None)
            return getattr(cfg, name, default) if value is None else value

        engines = agent.vllm_num_engines if cfg.rollout_backend == "vllm" else 0
        settings = resolve_engine_settings(True, cfg.colocate_all_models,
                                           gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                           enable_sleep=cfg.vllm_enable_sleep)
        out.append(AgentLayout(
            name=agent.name, shape=ModelShape.from_config(model_configs[agent.name], f"agent {agent.name!r}"),
            dp=agent.dp_size, zero_stage=agent.zero_stage, bf16=bool(agent.bf16),
            gradient_checkpointing=bool(agent.gradient_checkpointing), micro_batch=cfg.micro_train_batch_size,
            prompt_len=cfg.prompt_max_len, response_len=cfg.generate_max_len, logprob_path=cfg.logprob_path,
            attn_implementation=agent.attn_implementation, reference=cfg.algo.loss.uses_kl, engines=engines,
            tensor_parallel=agent.vllm_tensor_parallel_size, colocated=cfg.colocate_all_models,
            engine_utilization=settings.gpu_memory_utilization, engine_sleep=settings.enable_sleep_mode,
            lora_rank=int(option("lora_rank", 0) or 0), target_modules=str(option("target_modules", "all-linear")),
            adam_offload=bool(option("adam_offload", False)), param_offload=bool(option("param_offload", False)),
            deepspeed_enable_sleep=bool(option("deepspeed_enable_sleep", False)),
            ref_reward_offload=bool(option("ref_reward_offload", False)),
            accumulation_steps=max(1, cfg.train_batch_size // (cfg.micro_train_batch_size * agent.dp_size))))
    return out


# ---------------------------------------------------------------------------------------------------- rows
COMPONENTS = ("weights", "master", "gradients", "bucket", "optimizer", "activations", "logprobs", "gathered",
              "reference", "engine")
_HEADERS = {"weights": "weights", "master": "fp32 master", "gradients": "grads", "bucket": "grad bucket",
            "optimizer": "Adam",
            "activations": "activ.", "logprobs": "log-prob head", "gathered": "ZeRO-3 gather",
            "reference": "ref", "engine": "vLLM"}


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
    reference_bytes = w * P if lay.reference and lay.lora_rank == 0 else 0
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


# ---------------------------------------------------------------------------------------------------- plan
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


# ---------------------------------------------------------------------------------------------------- launch
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
    given = getattr(cfg, "gpu_memory_gb", None)
    return int(given * GIB) if given else detect()


def launch_memory_plan(cfg: TrainConfig, model_configs: Mapping[str, Any], log: Callable[[str], None] = print,
                       detect: Callable[[], int | None] = detect_gpu_bytes) -> MemoryPlan | None:
    """Print the run's plan; raise its refusal (:meth:`MemoryPlan.check`) unless ``--no_memory_check``. Without a
    known GPU size the plan is printed with a note and nothing is refused; a model the plan cannot count (a
    mixture of experts, a config without the usual size fields) is named and the plan skipped (returns None)."""
    try:
        layouts = agent_layouts(cfg, model_configs)
    except ValueError as err:
        log(f"memory plan skipped: {err}")
        return None
    plan = plan_run(layouts, gpu_bytes_of(cfg, detect), shared_gpu=not cfg.use_ray)
    log(plan.format_table())
    if plan.gpu_bytes is None:
        log("memory plan: GPU size unknown (no nvidia-smi on this node); pass --gpu_memory_gb to check the layout")
    elif getattr(cfg, "memory_check", True):
        plan.check()
    elif not plan.fits:
        log("memory plan: the layout does not fit by this estimate; launching anyway (--no_memory_check)")
    return plan
