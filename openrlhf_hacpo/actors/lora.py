"""LoRA agents: a loaded Hugging Face model trained through a peft LoRA adapter, seen from outside as the base model.

With ``lora_rank`` r > 0 every target linear layer W (out × in) gains a trainable low-rank update (Hu et al. 2021,
eq. 3): ``h = W x + (α / r) · B A x`` with A (r × in), B (out × r), B = 0 at the start. Only A and B train.

* :func:`apply_lora` wraps the model with peft as the agent's plan says (:class:`~openrlhf_hacpo.actors.agent_plan.
  LoraPlan`; rank 0 leaves it as it is): only the adapter's parameters
  require gradients, so only they reach the optimizer.
* :func:`merged_entries` is the weights view the engines and ``save_hf`` receive: each adapted weight exported as
  ``W + (α / r) · B A`` under the base model's own name (``model.layers.0.self_attn.q_proj.weight``, not peft's
  ``base_model.model.….base_layer.weight``), the adapter tensors left out. The sum is computed into the exported
  tensor (:meth:`~openrlhf_hacpo.actors.weight_entry.WeightEntry.merged`): the trained adapter is never touched.
* :class:`AdapterDisabledReference`: the reference policy of a LoRA agent is its own model with the adapter switched
  off (``disable_adapter()``), which computes exactly the base model: no second copy of the weights.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors.agent_plan import LoraPlan
from openrlhf_hacpo.actors.weight_entry import LowRankDelta, WeightEntry, weight_entries

__all__ = ["AdapterDisabledReference", "adapter_state_dict", "apply_lora", "base_model", "is_lora_model",
           "merged_entries"]

_PEFT_PREFIX = "base_model.model."
"""What peft puts before the base model's own parameter names."""


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` is a peft model (a LoRA agent's policy)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _target_modules(lora: LoraPlan) -> str | list[str]:
    value = lora.target_modules.strip()
    if value == "all-linear":
        return value
    return [name.strip() for name in value.split(",") if name.strip()]


def apply_lora(model: torch.nn.Module, lora: LoraPlan, agent: str) -> torch.nn.Module:
    """``model`` wrapped with the LoRA adapter of agent ``agent``'s plan (:attr:`~openrlhf_hacpo.actors.agent_plan.
    AgentPlan.lora`): rank ``lora.rank`` on ``lora.target_modules`` (the model unchanged when the rank is 0). Only
    the adapter's parameters require gradients afterwards; with gradient checkpointing the input embeddings' output
    requires gradients too, so the checkpointed blocks have a gradient path although the embedding is frozen. Raises ``ValueError`` naming the agent when the target modules match
    nothing or the adapter cannot be exported as merged weights."""
    if not lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=_target_modules(lora), bias="none", task_type="CAUSAL_LM")
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as err:
        raise ValueError(f"agent {agent!r}: LoRA with target_modules={lora.target_modules!r} cannot wrap "
                         f"{type(model).__name__}: {err}") from None
    for name, param in wrapped.named_parameters():
        param.requires_grad_(_is_adapter_name(wrapped, name))
    if getattr(model, "is_gradient_checkpointing", False):
        wrapped.enable_input_require_grads()
    try:
        merged_entries(wrapped)  # refuse an adapter the engines could not receive before training starts
    except ValueError as err:
        raise ValueError(f"agent {agent!r}: {err}") from None
    return wrapped


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a peft model (with the LoRA layers in it); ``model`` itself otherwise."""
    return model.get_base_model() if is_lora_model(model) else model


def _is_adapter_name(model: Any, name: str) -> bool:
    prefix = getattr(model.base_model, "prefix", "lora_")
    return any(part.startswith(prefix) for part in name.split("."))


def _base_name(name: str) -> str:
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


def _low_rank_deltas(model: Any) -> dict[int, list[LowRankDelta]]:
    """The active adapters' updates by the id of the weight they add to."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    deltas: dict[int, list[LowRankDelta]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear):
            raise ValueError(f"LoRA on {_base_name(name)!r} ({type(module).__name__}) is not supported: only linear "
                             "layers can be merged into the exported weights")
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            if module.use_dora.get(adapter, False):
                raise ValueError(f"DoRA on {_base_name(name)!r} is not supported")
            deltas.setdefault(id(module.get_base_layer().weight), []).append(LowRankDelta(
                a=module.lora_A[adapter].weight, b=module.lora_B[adapter].weight,
                scale=float(module.scaling[adapter]), transposed=bool(module.fan_in_fan_out)))
    return deltas


def merged_entries(model: torch.nn.Module) -> list[WeightEntry]:
    """The state-dict entries of the base model (its names, its order) with each adapted weight carrying the
    adapter's update ``(α / r) · B A`` to add on export; the adapter's own tensors are left out."""
    deltas = _low_rank_deltas(model)
    entries = []
    for entry in weight_entries(model):
        names = [_base_name(name) for name in entry.names if not _is_adapter_name(model, name)]
        if not names:
            continue
        update = tuple(deltas.get(id(entry.tensor), ()))
        if update and len(names) > 1:
            raise ValueError(f"LoRA on a tied weight ({', '.join(names)}) is not supported: the merged update would "
                             "change every name it is tied to; leave the output head out of target_modules")
        entries.append(WeightEntry(names, entry.tensor, entry.full_shape, deltas=update))
    return entries


def adapter_state_dict(model: torch.nn.Module, zero3: bool) -> dict[str, torch.Tensor]:
    """The adapter's tensors by peft name, CPU copies (gathered under ZeRO-3: every rank must call it)."""
    named = [(name, param) for name, param in model.named_parameters() if _is_adapter_name(model, name)]
    context: Any = contextlib.nullcontext()
    if zero3:
        import deepspeed

        context = deepspeed.zero.GatheredParameters([p for _, p in named if hasattr(p, "ds_id")],
                                                    modifier_rank=None)
    with context:
        return {name: param.detach().to("cpu", copy=True) for name, param in named}


class AdapterDisabledReference:
    """The reference policy of a LoRA agent: the policy's own model with its adapter switched off.

    ``disable_adapter()`` makes every LoRA layer compute ``W x`` alone, which is the frozen base model, the agent's
    initial policy; the log-probs are those :class:`~openrlhf_hacpo.actors.reference.ReferenceWorker` would compute
    from a second copy of ``pretrain``. Same call as that worker's :meth:`compute_logprobs`.
    """

    runs_on_policy_model = True
    """Its forward passes are the policy's (under ZeRO-3 they gather collectively across the agent's ranks)."""

    def __init__(self, model: Any, pad_token_id: int, micro_batch_size: int, device: Any,
                 logprob_path: str = "fused", kernel_backend: str = "auto") -> None:
        if not is_lora_model(model):
            raise TypeError(f"AdapterDisabledReference needs a peft model, got {type(model).__name__}")
        self.model, self.pad_token_id, self.micro_batch_size = model, int(pad_token_id), int(micro_batch_size)
        self.device, self.logprob_path, self.kernel_backend = device, logprob_path, kernel_backend

    def compute_logprobs(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                         temperature: float, group_by_length: bool = False) -> list[torch.Tensor]:
        """Per-token log-probs of each response under the base model (float32 CPU tensors), in eval mode (no
        dropout); the model's training mode is restored afterwards."""
        from openrlhf_hacpo.models import score_logprobs

        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return score_logprobs(self.model, prompt_ids, response_ids, self.pad_token_id, temperature,
                                      self.micro_batch_size, self.device, path=self.logprob_path,
                                      backend=self.kernel_backend, group_by_length=group_by_length)
        finally:
            self.model.train(was_training)
