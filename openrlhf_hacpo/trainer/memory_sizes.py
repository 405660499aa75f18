"""The sizes the memory plan counts with: the byte constants (CUDA context, allocator overhead, DeepSpeed's buffers
and fp32 copies, AdamW's temporary, activations per token) and a dense decoder's parameter counts
(:class:`ModelShape`, from its Hugging Face config).

Only numbers: no CUDA calls, no Ray, nothing of the run's layout (:mod:`openrlhf_hacpo.trainer.memory_layout`). The
formulas that use these sizes are in :mod:`openrlhf_hacpo.trainer.memory_rows`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ACTIVATION_FACTOR", "ADAM_BYTES", "ADAM_STEP_TEMP_BYTES", "ALLOCATOR_OVERHEAD", "CUDA_CONTEXT_BYTES",
           "GIB", "MASTER_BYTES", "OFFLOADED_GRADIENT_BYTES", "REDUCE_BUCKET_ELEMENTS", "SUB_GROUP_ELEMENTS",
           "ModelShape"]

GIB = 2**30

CUDA_CONTEXT_BYTES = 1 * GIB
"""GPU memory a process holds outside PyTorch's allocator: the CUDA context, cuBLAS / NCCL workspaces (0.5-1 GB
on recent GPUs; the upper end is taken). Counted for the policy process and for a sleeping colocated engine (an
awake engine's is inside its ``gpu_memory_utilization`` budget)."""

ALLOCATOR_OVERHEAD = 1.10
"""Factor on the policy process's tensor bytes for the caching allocator's fragmentation and temporaries the plan
does not list (DeepSpeed's gradient buffers are listed: see :mod:`openrlhf_hacpo.trainer.memory_rows`)."""

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
