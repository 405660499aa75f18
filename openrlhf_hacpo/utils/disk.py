"""Free-space checks before large writes, and plain-language reports of writes that failed for lack of space.

A full disk shows up in many shapes: ``OSError(ENOSPC)`` from Python's own writes, ``RuntimeError("... iostream
error")`` from ``torch.save``'s C++ writer, or a truncated file. :func:`explain_write_error` turns any of them into a
:class:`~openrlhf_hacpo.utils.errors.DiskSpaceError` when the file system is (nearly) full.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from openrlhf_hacpo.utils.errors import DiskSpaceError

__all__ = ["ensure_free_space", "explain_write_error", "folder_size", "free_bytes", "human_bytes"]

# below this many free bytes after a failed write, the failure is attributed to the full disk
_NEARLY_FULL = 16 * 2**20


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free for an unprivileged writer on the file system that holds ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing_ancestor(Path(path))).free


def folder_size(path: str | os.PathLike) -> int:
    """Total size of the regular files under ``path`` (0 when it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            file = os.path.join(folder, name)
            if not os.path.islink(file):
                total += os.path.getsize(file)
    return total


def ensure_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise :class:`DiskSpaceError` when fewer than ``needed`` bytes are free where ``path`` will be written."""
    free = free_bytes(path)
    if needed > free:
        raise DiskSpaceError(errno.ENOSPC, f"no space left on device for {what}: it needs about "
                             f"{human_bytes(needed)} at {path}, only {human_bytes(free)} are free")


def explain_write_error(err: BaseException, path: str | os.PathLike, what: str) -> BaseException | None:
    """A :class:`DiskSpaceError` naming ``what`` and ``path`` when ``err`` comes from a full disk, else None."""
    if isinstance(err, DiskSpaceError):
        return err
    full = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full:
        try:
            full = free_bytes(path) < _NEARLY_FULL
        except OSError:
            full = False
    if not full:
        return None
    return DiskSpaceError(errno.ENOSPC, f"no space left on device while writing {what} to {path} "
                          f"({human_bytes(free_bytes(path))} free; {type(err).__name__}: {err})")
