"""What one policy rank's checkpoint save wrote: the manifest the driver verifies before the checkpoint counts.

A rank of an agent writes, under the agent's checkpoint folder, the DeepSpeed files DeepSpeed gives that rank (the
model states on the rank that stores them, its ZeRO optimizer partition) and its own RNG file. :func:`rank_manifest`
lists them with their sizes as the rank sees them on its own node; the driver then checks every listed file on its
side (:func:`openrlhf_hacpo.trainer.checkpoint.verify_saved_files`), which catches a rank whose node writes into a
folder the driver cannot see.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Sequence

__all__ = ["deepspeed_rank_files", "rank_manifest"]


def deepspeed_rank_files(engine: Any, path: str, tag: str) -> list[str]:
    """The files ``engine.save_checkpoint(path, tag=tag)`` writes on this rank, by DeepSpeed's own naming: the model
    states when this rank stores them (``save_non_zero_checkpoint``: data-parallel rank 0, every rank under ZeRO-3)
    and the optimizer partition when it stores one (``save_zero_checkpoint``)."""
    files = []
    if getattr(engine, "save_non_zero_checkpoint", False):
        files.append(engine._get_ckpt_name(path, tag))
    if getattr(engine, "save_zero_checkpoint", False):
        files.append(engine._get_zero_ckpt_name(path, tag))
    return files


def rank_manifest(rank: int, path: str, files: Sequence[str]) -> dict[str, Any]:
    """``{"rank", "host", "files": {path relative to path: size in bytes, -1 when absent}}`` for files this rank
    wrote under ``path``, stat'ed on this rank's node."""
    sizes = {}
    for file in files:
        try:
            size = os.path.getsize(file)
        except OSError:
            size = -1
        sizes[os.path.relpath(file, path)] = size
    return {"rank": rank, "host": socket.gethostname(), "files": sizes}
