"""Atomic file and directory writes.

Every writer builds its output next to the destination (same directory, so the same file system) under a hidden
temporary name, flushes it to disk, then moves it into place with :func:`os.replace`. A reader therefore sees either
the previous complete version or the new complete version, never a half-written one, and an exception while writing
leaves the previous version untouched.

Directories cannot be swapped in one system call by portable code: :func:`atomic_dir` builds the new directory in a
temporary sibling, flushes every file and folder in it to disk, renames the previous version aside, renames the new one into place and only then deletes the
previous version. If the process dies between the two renames, the previous version survives under
``.<name>.old-*`` next to the destination.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]

__all__ = [
    "atomic_dir",
    "atomic_torch_save",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
]


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp/mkdtemp create private entries (0600/0700); atomic writes give them the modes that a plain open()/mkdir()
# would. The umask is read once, at import, because reading it means setting it.
_UMASK = _read_umask()
_FILE_MODE = 0o666 & ~_UMASK
_DIR_MODE = 0o777 & ~_UMASK


def _fsync_dir(directory: Path) -> None:
    """Flush a directory entry change (rename) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` to disk, so a rename of ``root`` never exposes unwritten data."""
    for folder, _, files in os.walk(root):
        for name in files:
            file = os.path.join(folder, name)
            if os.path.islink(file):
                continue
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def _atomic_write(path: PathLike, write: Callable[[Any], None], mode: str, encoding: str | None = None) -> Path:
    """Call ``write(file_object)`` on a temporary sibling of ``path``, then move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, _FILE_MODE)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text({str(path)!r}): text must be str, got {type(text).__name__}")
    return _atomic_write(path, lambda f: f.write(text), "w", encoding)


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    return _atomic_write(path, lambda f: f.write(data), "wb")


def atomic_write_json(path: PathLike, obj: Any, indent: int | None = 2, sort_keys: bool = False) -> Path:
    """Serialise ``obj`` as JSON (strict: NaN/inf are rejected) and write it to ``path`` atomically.

    The object is serialised before the temporary file is created, so an object that cannot be serialised leaves
    no trace on disk.
    """
    try:
        text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot write {str(path)!r} as JSON: {err}") from err
    return atomic_write_text(path, text + "\n")


def atomic_torch_save(obj: Any, path: PathLike) -> Path:
    """``torch.save(obj, path)`` through a temporary sibling file; returns the path."""
    import torch

    return _atomic_write(path, lambda f: torch.save(obj, f), "wb")


@contextlib.contextmanager
def atomic_dir(path: PathLike) -> Iterator[Path]:
    """Build a directory in a temporary sibling and move it onto ``path`` when the block succeeds.

    Usage::

        with atomic_dir("ckpt/step_10") as tmp:
            (tmp / "model.safetensors").write_bytes(...)

    On success the files of the new directory are fsynced, then any previous ``path`` (file or directory) is
    replaced; on an exception the temporary directory is deleted and the previous ``path`` is left exactly as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, _DIR_MODE)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    old: Path | None = None
    if path.exists() or path.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        old.rmdir()  # only the unique name is wanted; os.replace needs the target not to exist
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
