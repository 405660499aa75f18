"""The frozen reference policy of one agent (its initial weights), for the KL term on own rows (docs/algorithm.md §3).

Log-probs come from :func:`openrlhf_hacpo.models.score_logprobs` (the fused LM-head path by default). With
``ref_reward_offload`` the model waits on the CPU between its forwards and visits the device only to score.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Sequence

import torch

from openrlhf_hacpo.models import score_logprobs

__all__ = ["ReferenceWorker", "reference_actor_class"]


class ReferenceWorker:
    """An agent's initial policy, frozen, in inference mode.

    Args:
        pretrain: model folder or hub id (the agent's ``pretrain``).
        bf16: load in bfloat16 (else float32).
        attn_implementation: passed to ``from_pretrained``.
        pad_token_id: id used for padding rows (any id works: padding is masked).
        micro_batch_size: rows per forward.
        logprob_path / kernel_backend: see :func:`openrlhf_hacpo.models.response_logprobs`.
        device: ``"cpu"`` keeps the model on the CPU even where CUDA is present (``--device cpu``).
        offload: keep the model on the CPU between calls and move it to the device for each
            :meth:`compute_logprobs` (``ref_reward_offload``; on a CPU device the moves change nothing).
    """

    def __init__(self, pretrain: str, bf16: bool = False, attn_implementation: str = "sdpa",
                 pad_token_id: int = 0, micro_batch_size: int = 8, logprob_path: str = "fused",
                 kernel_backend: str = "auto", device: str = "auto", offload: bool = False) -> None:
        self.pretrain = pretrain
        self.bf16 = bf16
        self.attn_implementation = attn_implementation
        self.pad_token_id = int(pad_token_id)
        self.micro_batch_size = int(micro_batch_size)
        self.logprob_path = logprob_path
        self.kernel_backend = kernel_backend
        self.requested_device = device
        self.offload = bool(offload)
        self.model = None

    def setup(self) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        from openrlhf_hacpo.engines.placement import actor_device

        device = actor_device(self.requested_device)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                self.pretrain, dtype=torch.bfloat16 if self.bf16 else torch.float32,
                attn_implementation=self.attn_implementation)
        except OSError as err:
            raise FileNotFoundError(f"reference model {self.pretrain!r} cannot be loaded: {err}") from err
        model.requires_grad_(False)
        self.device = device
        self.model = model.to(self._resting_device).eval()
        return {"num_parameters": sum(p.numel() for p in self.model.parameters())}

    def compute_logprobs(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                         temperature: float, group_by_length: bool = False) -> list[torch.Tensor]:
        """Per-token reference log-probs of each response (float32 CPU tensors aligned with ``response_ids``);
        ``group_by_length`` packs rows of similar length together (same values, less padding computed)."""
        if self.model is None:
            raise RuntimeError("ReferenceWorker.setup() was not called")
        with self._on_device():
            return score_logprobs(self.model, prompt_ids, response_ids, self.pad_token_id, temperature,
                                  self.micro_batch_size, self.device, path=self.logprob_path,
                                  backend=self.kernel_backend, group_by_length=group_by_length)

    @property
    def _resting_device(self) -> torch.device:
        """Where the model waits between calls: the CPU with ``offload``, else the device it scores on."""
        return torch.device("cpu") if self.offload else self.device

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """The model on the scoring device for the block, back where it rests afterwards (errors included)."""
        if not self.offload:
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to(self._resting_device)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()


@functools.cache
def reference_actor_class():
    """``ray.remote(ReferenceWorker)``, made on first use (importing this module does not import Ray)."""
    import ray

    return ray.remote(ReferenceWorker)
