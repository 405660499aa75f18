"""Loading ``torch.save`` files without running code from them, with errors that name the owner and the file.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers (dict, list, tuple, str, numbers,
None); a pickle that asks for anything else is refused instead of executed. Every file this project writes into a
checkpoint (the trainer state, the RNG states of the driver and of every policy rank) holds only such values, so it
loads this way. DeepSpeed's own checkpoint files are loaded by DeepSpeed (see docs/training.md, "Security").
"""
from __future__ import annotations

import os
import pickle
from typing import Any

from openrlhf_hacpo.utils.errors import CheckpointError

__all__ = ["load_torch_file"]


def load_torch_file(path: str | os.PathLike, owner: str) -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; any failure becomes a :class:`CheckpointError`.

    Args:
        path: the file.
        owner: who the file belongs to, for the message (``"agent 'qwen'"``, ``"the trainer state"``).
    """
    import torch

    if not os.path.isfile(path):
        raise CheckpointError(f"{owner}: checkpoint file {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            raise CheckpointError(f"{owner}: checkpoint file {path} holds objects other than tensors and plain "
                                  f"containers, refused without running them ({reason})") from err
        raise CheckpointError(f"{owner}: checkpoint file {path} is corrupt ({reason})") from err
    except (OSError, RuntimeError, EOFError, ValueError, AttributeError, ImportError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(f"{owner}: checkpoint file {path} is corrupt or truncated "
                              f"({type(err).__name__}: {reason})") from err
