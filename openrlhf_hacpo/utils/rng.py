"""Capture and restore the random-number-generator states of one process (Python, numpy, torch, CUDA).

Checkpoints store them so that a resumed run draws the same numbers as an uninterrupted one; the driver and every
policy rank capture their own.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state(cuda: bool = True) -> dict[str, Any]:
    """Python, numpy and torch RNG states of this process (and every visible GPU's with ``cuda``).

    The driver passes ``cuda=False``: reading the CUDA states would create a CUDA context on every GPU of the driver's
    machine, and the driver never draws from them (the policy ranks capture their own). The numpy state is stored as a
    tensor so the result loads with ``torch.load(weights_only=True)``.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (also accepts a numpy state stored as numpy's own tuple)."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
