"""Backend selection for every op in :mod:`kernels`.

``backend="auto"`` picks the Triton kernel for CUDA tensors of a dtype the kernels take (fp16, bf16, fp32) and the
torch twin otherwise (CPU tensors, and float64 anywhere: the twins compute in float64). The environment
variable ``HACPO_KERNEL_BACKEND`` (``triton`` | ``torch`` | ``auto``) overrides the ``auto`` choice only; an
explicit ``backend="triton"`` or ``backend="torch"`` argument always wins.

Triton on CPU tensors works only through Triton's interpreter, which must be switched on
(``TRITON_INTERPRET=1``) *before* :mod:`kernels` is imported, because Triton reads the variable when a
kernel is decorated.
"""
from __future__ import annotations

import os

import torch

from ._utils import FLOAT_DTYPES, HAS_TRITON, is_interpreted

__all__ = ["BACKENDS", "ENV_VAR", "resolve_backend", "interpreter_active"]

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "HACPO_KERNEL_BACKEND"


def interpreter_active(kernel=None) -> bool:
    """Whether Triton kernels run in the interpreter.

    With ``kernel`` given, answers for that decorated kernel (the truth); otherwise reads Triton's knob, which
    matches the kernels as long as ``TRITON_INTERPRET`` did not change after :mod:`kernels` was imported.
    """
    if not HAS_TRITON:
        return False
    if kernel is not None:
        return is_interpreted(kernel)
    import triton

    return bool(triton.knobs.runtime.interpret)


def resolve_backend(backend: str, tensor: torch.Tensor, kernel=None) -> str:
    """Return ``"triton"`` or ``"torch"`` for an op whose main input is ``tensor``.

    Args:
        backend: ``"auto"``, ``"triton"`` or ``"torch"``.
        tensor: the op's main input; its device and dtype decide ``auto``.
        kernel: optional decorated Triton kernel of the op, used to tell whether it runs interpreted.

    Raises:
        ValueError: unknown backend name (argument or environment variable).
        RuntimeError: Triton requested but not installed, or requested for CPU tensors without the interpreter.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        env = os.environ.get(ENV_VAR, "").strip().lower()
        if env and env not in BACKENDS:
            raise ValueError(f"environment variable {ENV_VAR} must be one of {BACKENDS}, got {env!r}")
        if env in ("triton", "torch"):
            backend = env
        else:
            backend = "triton" if (tensor.is_cuda and HAS_TRITON and tensor.dtype in FLOAT_DTYPES) else "torch"
    if backend == "torch":
        return "torch"
    if not HAS_TRITON:
        raise RuntimeError("backend='triton' needs the triton package, which is not installed; use backend='torch'")
    if not tensor.is_cuda and not interpreter_active(kernel):
        raise RuntimeError(
            f"backend='triton' got a tensor on {tensor.device}; Triton kernels run on CUDA tensors, or on CPU "
            "tensors only under Triton's interpreter (set TRITON_INTERPRET=1 before importing kernels)"
        )
    return "triton"
