"""Loading ``torch.save`` files without running code from them, with errors that name the owner and the file.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers (dict, list, tuple, str, numbers,
None), here also numpy arrays of the uint32 dtype (the numpy RNG state as checkpoints written before the RNG state
was stored as a tensor hold it); a pickle that asks for anything else is refused instead of executed. Every file this project writes into a
checkpoint (the trainer state, the RNG states of the driver and of every policy rank) holds only such values, so it
loads this way. DeepSpeed's own checkpoint files are loaded by DeepSpeed (see docs/training.md, "Security").
"""
from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any, Iterator

from openrlhf_hacpo.utils.disk import explain_write_error
from openrlhf_hacpo.utils.errors import CheckpointError

__all__ = ["checkpoint_io", "load_torch_file"]


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
        with torch.serialization.safe_globals(_numpy_rng_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = _detail(err)
        if "GLOBAL" in reason:
            raise CheckpointError(f"{owner}: checkpoint file {path} holds objects other than tensors and plain "
                                  f"containers, refused without running them ({reason})") from err
        raise CheckpointError(f"{owner}: checkpoint file {path} is corrupt ({reason})") from err
    except (OSError, RuntimeError, EOFError, ValueError, AttributeError, ImportError) as err:
        reason = _detail(err)
        raise CheckpointError(f"{owner}: checkpoint file {path} is corrupt or truncated "
                              f"({type(err).__name__}: {reason})") from err


def _numpy_rng_globals() -> list[Any]:
    """What unpickling a numpy uint32 array needs (numpy's RNG state in older checkpoints)."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


@contextlib.contextmanager
def checkpoint_io(owner: str, path: str | os.PathLike, action: str) -> Iterator[None]:
    """Name the owner and the folder in any failure of a checkpoint ``action`` (``"load"`` or ``"save"``) done by a
    library (DeepSpeed's ``engine.load_checkpoint`` / ``save_checkpoint``); a save that failed on a full disk becomes
    a :class:`~openrlhf_hacpo.utils.errors.DiskSpaceError` saying "no space left on device"."""
    if action not in ("load", "save"):
        raise ValueError(f"checkpoint_io: action must be 'load' or 'save', got {action!r}")
    try:
        yield
    except CheckpointError:
        raise
    except Exception as err:
        if action == "save":
            explained = explain_write_error(err, path, f"the checkpoint of {owner}")
            if explained is not None:
                raise explained from err
        raise CheckpointError(f"{owner}: cannot {action} the checkpoint under {path} "
                              f"({type(err).__name__}: {_detail(err)})") from err


def _detail(err: BaseException) -> str:
    """The informative line of a loader error: torch's weights-only refusals put it after a long preamble."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if "GLOBAL" in line or line.startswith("Unsupported"):
            return line
    return lines[0] if lines else type(err).__name__
