"""Shared helpers for the kernels: optional Triton import, launch sizes, input checks.

Triton is optional. Without it the modules still import (the kernel bodies are then plain, never-called
Python functions) and every op runs through its torch twin; asking for ``backend="triton"`` raises a clear
error from :func:`kernels.dispatch.resolve_backend`.
"""
from __future__ import annotations

import torch

try:  # pragma: no cover - exercised by whichever branch the environment has
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton is a hard dependency on Linux
    HAS_TRITON = False

    class _TritonMissing:
        """Stand-in for ``triton`` / ``triton.language`` so the kernel definitions still parse."""

        constexpr = None
        float32 = None

        @staticmethod
        def jit(fn=None, **_kwargs):
            return fn if fn is not None else (lambda f: f)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(int(n) - 1, 0).bit_length()

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

    triton = _TritonMissing()  # type: ignore[assignment]
    tl = _TritonMissing()  # type: ignore[assignment]

__all__ = [
    "HAS_TRITON",
    "triton",
    "tl",
    "is_interpreted",
    "next_power_of_2",
    "cdiv",
    "check_labels",
    "FLOAT_DTYPES",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""Input dtypes the Triton kernels accept (the torch twins also accept float64)."""


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was decorated while ``TRITON_INTERPRET=1`` (runs on CPU tensors, slowly)."""
    return type(kernel).__name__ == "InterpretedFunction"


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def check_labels(labels: torch.Tensor, num_rows: int, vocab_size: int, ignore_index: int, name: str = "labels") -> None:
    """Validate a label vector: integer dtype, length ``num_rows``, values in ``[0, vocab_size)`` or ``ignore_index``.

    The range check costs one device synchronisation.
    """
    if labels.dim() != 1 or labels.shape[0] != num_rows:
        raise ValueError(f"{name} must have shape [{num_rows}], got {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"{name} must be an integer tensor, got {labels.dtype}")
    if num_rows == 0:
        return
    valid = labels != ignore_index
    bad = valid & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"{name}[{first}] = {int(labels[first])} is outside [0, {vocab_size}) "
            f"and is not ignore_index={ignore_index}"
        )
