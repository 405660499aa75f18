"""Capture and restore the random-number-generator states of one process (Python, numpy, torch, CUDA).

Checkpoints store them so that a resumed run draws the same numbers as an uninterrupted one; the driver and every
policy rank capture their own.

Only the process's *current* CUDA device is read. A worker draws only from the generator of the GPU it computes on,
and reading every device's state (``torch.cuda.get_rng_state_all``) creates a CUDA context on each of them: under
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` every GPU of the node is visible to every worker, so each
checkpoint would put a context (hundreds of MiB) on GPUs that vLLM engines have already filled.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state(cuda: bool = True) -> dict[str, Any]:
    """Python, numpy and torch RNG states of this process, and with ``cuda`` the current CUDA device's.

    The driver passes ``cuda=False``: it never draws from a CUDA generator (the policy ranks capture their own) and
    reading one would create a CUDA context on its machine. The numpy state is stored as a tensor so the result
    loads with ``torch.load(weights_only=True)``. ``"cuda"`` holds one generator state (a byte tensor) and
    ``"cuda_device"`` the index of the device it was read from.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if cuda and torch.cuda.is_available():
        device = torch.cuda.current_device()
        state["cuda"] = torch.cuda.get_rng_state(device)
        state["cuda_device"] = int(device)
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (also accepts a numpy state stored as numpy's own tuple).

    The CUDA state goes to the current device. A state written by earlier versions holds a list with one entry per
    visible device; the entry of the current device is restored.
    """
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda_state = state.get("cuda")
    if cuda_state is None or not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if isinstance(cuda_state, (list, tuple)):
        if device >= len(cuda_state):
            raise ValueError(f"the saved CUDA RNG states cover {len(cuda_state)} device(s); this process computes on "
                             f"device {device}")
        cuda_state = cuda_state[device]
    torch.cuda.set_rng_state(cuda_state, device)
