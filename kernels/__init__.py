"""Fused log-prob / entropy / HACPO-loss kernels: Triton kernels with torch twins behind one dispatcher.

``backend="auto"`` runs Triton for CUDA tensors and the torch twin otherwise (``HACPO_KERNEL_BACKEND`` overrides
the automatic choice). This package imports nothing from ``openrlhf_hacpo``.
"""
from ._utils import HAS_TRITON
from .dispatch import resolve_backend
from .fused_linear_logprobs import fused_linear_logprobs
from .hacpo_loss import METRIC_NAMES, cross_clip_lower_bound, hacpo_loss
from .logprobs import logprobs_from_logits

__all__ = [
    "HAS_TRITON",
    "METRIC_NAMES",
    "cross_clip_lower_bound",
    "fused_linear_logprobs",
    "hacpo_loss",
    "logprobs_from_logits",
    "resolve_backend",
]
