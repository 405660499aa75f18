"""The frozen reference policy of one agent (its initial weights), for the KL term on own rows (spec §3.e).

:func:`response_logprobs` is the one place where a causal LM's log-probs of response tokens are computed; the policy
worker uses it too. Logits stay in the model's dtype: only the response positions are selected, and
``kernels.logprobs_from_logits`` computes the temperature-scaled log-softmax without an fp32 copy of them.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from hacpo_kernels import logprobs_from_logits
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow

__all__ = ["ReferenceWorker", "ReferenceActor", "response_logprobs", "rows_to_batch"]


def response_logprobs(model: Any, padded: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """log π(y_t | x, y_<t) at ``temperature`` for every response token of a padded batch, [B, R] (0 on padding).

    ``padded`` is :meth:`LearnerBatch.to_padded` output: left-padded prompts in columns [0, P), right-padded
    responses in [P, P+R), explicit position ids. Gradients flow when called with grad enabled.
    """
    response_ids = padded["response_ids"]
    mask = padded["response_mask"] > 0
    num_resp = response_ids.shape[1]
    out = model(
        input_ids=padded["input_ids"],
        attention_mask=padded["attention_mask"],
        position_ids=padded["position_ids"],
        use_cache=False,
        logits_to_keep=num_resp + 1,
    )
    logits = out.logits[:, :-1]  # position P-1+t predicts response token t
    logp, _ = logprobs_from_logits(logits[mask], response_ids[mask], temperature=temperature)
    return torch.zeros(mask.shape, dtype=logp.dtype, device=logp.device).masked_scatter(mask, logp)


def rows_to_batch(prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> LearnerBatch:
    """Wrap (prompt ids, response ids) pairs as a :class:`LearnerBatch`, to pack them with ``to_padded``."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} responses")
    rows = [
        LearnerRow(prompt_id=str(i), prompt_ids=list(p), response_ids=list(r), is_own=True, source=0, reward=0.0,
                   old_logp_mean=0.0, old_logp=None)
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids))
    ]
    for i, row in enumerate(rows):
        if not row.prompt_ids or not row.response_ids:
            raise ValueError(f"row {i} has an empty prompt or response")
    return LearnerBatch(learner=0, rows=rows)


@torch.no_grad()
def score_rows(model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
               pad_id: int, temperature: float, micro_batch_size: int, device: Any) -> list[list[float]]:
    """Per-token log-probs of each response given its prompt, in micro-batches without gradient."""
    if not prompt_ids:
        return []
    batch = rows_to_batch(prompt_ids, response_ids)
    out: list[list[float]] = []
    for micro in batch.micro_batches(micro_batch_size):
        padded = micro.to_padded(pad_id, device=device)
        logp = response_logprobs(model, padded, temperature).float().cpu()
        for i, row in enumerate(micro.rows):
            out.append(logp[i, : len(row.response_ids)].tolist())
    return out


class ReferenceWorker:
    """An agent's initial policy, frozen, in inference mode.

    Args:
        pretrain: model folder or hub id (the agent's ``pretrain``).
        bf16: load in bfloat16 (else float32).
        attn_implementation: passed to ``from_pretrained``.
        pad_token_id: id used for padding rows (any id works: padding is masked).
        micro_batch_size: rows per forward.
    """

    def __init__(self, pretrain: str, bf16: bool = False, attn_implementation: str = "sdpa",
                 pad_token_id: int = 0, micro_batch_size: int = 8) -> None:
        self.pretrain = pretrain
        self.bf16 = bf16
        self.attn_implementation = attn_implementation
        self.pad_token_id = int(pad_token_id)
        self.micro_batch_size = int(micro_batch_size)
        self.model = None

    def setup(self) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                self.pretrain, dtype=torch.bfloat16 if self.bf16 else torch.float32,
                attn_implementation=self.attn_implementation)
        except OSError as err:
            raise FileNotFoundError(f"reference model {self.pretrain!r} cannot be loaded: {err}") from err
        model.requires_grad_(False)
        self.model = model.to(device).eval()
        self.device = device
        return {"num_parameters": sum(p.numel() for p in self.model.parameters())}

    def compute_logprobs(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                         temperature: float) -> list[list[float]]:
        """Per-token reference log-probs of each response (lists aligned with ``response_ids``)."""
        if self.model is None:
            raise RuntimeError("ReferenceWorker.setup() was not called")
        return score_rows(self.model, prompt_ids, response_ids, self.pad_token_id, temperature,
                          self.micro_batch_size, self.device)

    def ping(self) -> bool:
        return True


def _remote_class():
    import ray

    return ray.remote(ReferenceWorker)


ReferenceActor = _remote_class()
