"""Fused log-prob / entropy / HACPO-loss kernels: Triton kernels with torch twins behind one dispatcher.

``backend="auto"`` runs Triton for CUDA tensors and the torch twin otherwise (``HACPO_KERNEL_BACKEND`` overrides
the automatic choice). This package imports nothing from ``openrlhf_hacpo``.

The folder is ``kernels/`` but the package installs as ``hacpo_kernels`` (``package_dir`` in ``setup.py``), so the
Hugging Face ``kernels`` package (which transformers probes for) and this one coexist. When the repository root is
on ``sys.path`` (running from a checkout), ``import kernels`` would find this folder first; in that case the import
is handed over to the installed package of that name, or, when there is none, yields an empty module whose
attributes raise an error naming ``hacpo_kernels``.
"""
if __name__ == "kernels":  # found through the repository root on sys.path, not as hacpo_kernels
    from ._shadow import hand_over as _hand_over

    _hand_over(__file__, globals())
    del _hand_over
else:
    from ._utils import HAS_TRITON
    from .dispatch import resolve_backend
    from .fused_linear_logprobs import fused_linear_logprobs
    from .hacpo_loss import METRIC_NAMES, LossParams, LossTotals, cross_clip_lower_bound, hacpo_loss
    from .logprobs import logprobs_from_logits

    __all__ = [
        "HAS_TRITON",
        "LossParams",
        "LossTotals",
        "METRIC_NAMES",
        "cross_clip_lower_bound",
        "fused_linear_logprobs",
        "hacpo_loss",
        "logprobs_from_logits",
        "resolve_backend",
    ]
