r"""Response log-probs (and entropy) of a causal LM, without the logits of all response tokens.

:func:`response_logprobs` is the one place where the policy update, old-log-prob scoring and reference scoring
compute :math:`\log\pi(y_t \mid x, y_{<t})` at the rollout temperature. Two paths:

* ``fused`` (default): the model runs its normal forward (DeepSpeed engine, gradient checkpointing, ZeRO-3
  gather hooks all unchanged), but the LM head module computes, for the selected response positions only,
  ``log softmax((h W^T + b) / T)[y]`` and the entropy with :func:`hacpo_kernels.fused_linear_logprobs`: the logits
  exist one tile at a time (Triton on CUDA, the torch twin elsewhere). The head's ``forward`` is swapped for the
  duration of the call, so under ZeRO-3 the head weight is gathered once, by the head's own pre-forward hook, and
  re-gathered for backward by DeepSpeed's hooks on the head's output. Tied and untied heads, a head bias, bf16 and
  fp32 work unchanged.
* ``logits``: the model returns the logits of the response positions (in the model dtype) and
  :func:`hacpo_kernels.logprobs_from_logits` reduces them. Used for models whose head is not a plain linear map
  (e.g. logit soft-capping or a logit scale), with a logged notice, or when asked for.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from hacpo_kernels import fused_linear_logprobs, logprobs_from_logits
from openrlhf_hacpo.utils.padding import micro_batch_groups, pack_rows

__all__ = ["LOGPROB_PATHS", "ResponseLogprobs", "fused_head_unsupported", "response_logprobs", "score_logprobs"]

LOGPROB_PATHS = ("fused", "logits")

logger = logging.getLogger(__name__)
_NOTICED: set[str] = set()

_UNSUPPORTED_CONFIG_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


@dataclass
class ResponseLogprobs:
    """``logp`` [B, R] log-probs of the response tokens (0 on padding), ``entropy`` [B, R] detached entropy of the
    next-token distribution at each response position (``None`` unless asked for)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None


def _unwrap(model: Any) -> torch.nn.Module:
    """The HF model inside a DeepSpeed engine (or the model itself)."""
    return getattr(model, "module", model)


def fused_head_unsupported(model: Any) -> str | None:
    """Why the fused path cannot run on ``model`` (``None`` when it can)."""
    module = _unwrap(model)
    get_head = getattr(module, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Linear):
        return f"its output embedding is {type(head).__name__}, not a torch.nn.Linear"
    config = getattr(module, "config", None)
    for field in _UNSUPPORTED_CONFIG_FIELDS:
        value = getattr(config, field, None)
        if value not in (None, 0, 1, 1.0, False):
            return f"its config sets {field}={value!r}, which the head applies after the linear map"
    return None


@contextlib.contextmanager
def _head_computes_logprobs(head: torch.nn.Linear, mask: torch.Tensor, labels: torch.Tensor, temperature: float,
                            with_entropy: bool, backend: str):
    """Within the block, ``head(hidden [B, R+1, H])`` returns ``[N, 2]`` = (log-prob, entropy) of the N masked
    response tokens instead of ``[B, R+1, V]`` logits."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        selected = hidden[:, :-1][mask]  # position P-1+t predicts response token t
        logp, entropy = fused_linear_logprobs(selected, head.weight, labels, temperature=temperature,
                                              return_entropy=with_entropy, bias=head.bias, backend=backend)
        if entropy is None:
            entropy = torch.zeros_like(logp)
        return torch.stack([logp, entropy.detach()], dim=-1)

    head.forward = forward  # instance attribute: nn.Module.__call__ (and its hooks) run it
    try:
        yield
    finally:
        del head.forward


def response_logprobs(model: Any, padded: dict[str, torch.Tensor], temperature: float, *, with_entropy: bool = False,
                      path: str = "fused", backend: str = "auto") -> ResponseLogprobs:
    """Log-probs at ``temperature`` of every response token of a padded batch (gradients flow when grad is on).

    ``padded`` holds the tensors of :func:`openrlhf_hacpo.utils.padding.pack_rows` (``input_ids``,
    ``attention_mask``, ``position_ids``, ``response_ids``, ``response_mask``; any other keys are ignored):
    left-padded prompts in columns [0, P), right-padded responses in [P, P+R), explicit position ids. ``path`` is
    ``"fused"`` or ``"logits"`` (see the module docstring); ``backend`` is the kernel backend (``auto`` | ``triton``
    | ``torch``).
    """
    if path not in LOGPROB_PATHS:
        raise ValueError(f"log-prob path must be one of {LOGPROB_PATHS}, got {path!r}")
    response_ids = padded["response_ids"]
    mask = padded["response_mask"] > 0
    num_resp = response_ids.shape[1]
    inputs = dict(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                  position_ids=padded["position_ids"], use_cache=False, logits_to_keep=num_resp + 1)
    if path == "fused":
        reason = fused_head_unsupported(model)
        if reason is not None:
            name = type(_unwrap(model)).__name__
            if name not in _NOTICED:
                _NOTICED.add(name)
                logger.warning("%s: log-probs from full logits, because %s", name, reason)
            path = "logits"
    if path == "fused":
        head = _unwrap(model).get_output_embeddings()
        with _head_computes_logprobs(head, mask, response_ids[mask], temperature, with_entropy, backend):
            packed = model(**inputs).logits  # [N, 2]
        logp, entropy = packed[:, 0], packed[:, 1]
    else:
        logits = model(**inputs).logits[:, :-1]
        logp, entropy = logprobs_from_logits(logits[mask], response_ids[mask], temperature=temperature,
                                             return_entropy=with_entropy, backend=backend)
        if entropy is not None:
            entropy = entropy.detach()

    def unpack(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)

    return ResponseLogprobs(logp=unpack(logp), entropy=unpack(entropy).detach() if with_entropy else None)


@torch.no_grad()
def score_logprobs(model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                   pad_id: int, temperature: float, micro_batch_size: int, device: Any, *, path: str = "fused",
                   backend: str = "auto", group_by_length: bool = False) -> list[torch.Tensor]:
    """Per-token log-probs of each response given its prompt, in micro-batches of rows without gradient: one
    float32 CPU tensor per row, aligned with ``response_ids`` (rows packed by
    :func:`openrlhf_hacpo.utils.padding.pack_rows`, as the update packs them). ``group_by_length`` packs rows of
    similar length together (:func:`openrlhf_hacpo.utils.padding.length_grouped`), so little padding is computed;
    the rows come back in their given order either way."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        if not len(prompt) or not len(response):
            raise ValueError(f"row {i} has an empty prompt or response")
    groups = micro_batch_groups([len(p) for p in prompt_ids], [len(r) for r in response_ids], micro_batch_size,
                                group_by_length)
    out: list[torch.Tensor | None] = [None] * len(prompt_ids)
    for group in groups:
        responses = [response_ids[i] for i in group]
        packed = pack_rows([prompt_ids[i] for i in group], responses, pad_id).to(device)
        logp = response_logprobs(model, packed, temperature, path=path, backend=backend).logp.float().cpu()
        for j, i in enumerate(group):
            out[i] = logp[j, : len(responses[j])].clone()  # own storage each
    return out

