"""Resident memory of the current process: its peak (high-water mark) and its present resident set.

On Linux both come from ``/proc/self/status`` (``VmHWM``, the peak resident set since the process started, and
``VmRSS``), in kiB there. Elsewhere the peak is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (kiB on Linux, bytes on
macOS) and the present resident set is unknown. No sampling: the kernel keeps the peak, so a spike between two
reads is never missed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["ProcessMemory", "process_memory", "status_bytes"]

_STATUS = "/proc/self/status"


@dataclass(frozen=True)
class ProcessMemory:
    """``peak_rss_bytes``: the process's peak resident set so far; ``rss_bytes``: its resident set now (``None``
    where the platform does not say); ``source``: where the figures come from."""

    peak_rss_bytes: int
    rss_bytes: int | None
    source: str


def status_bytes(status_text: str, field: str) -> int | None:
    """The value of ``field`` (e.g. ``VmHWM``) in the text of a ``/proc/<pid>/status`` file, in bytes; ``None`` when
    the field is absent. Values there are ``<number> kB`` (kiB); a line in another unit is a ``ValueError``."""
    for line in status_text.splitlines():
        name, sep, value = line.partition(":")
        if not sep or name.strip() != field:
            continue
        parts = value.split()
        if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
            raise ValueError(f"{_STATUS}: cannot read {field!r} from {line.strip()!r} (expected '<number> kB')")
        return int(parts[0]) * 1024
    return None


def _ru_maxrss_bytes() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # bytes on macOS, kiB on Linux and BSDs


def process_memory() -> ProcessMemory:
    """This process's peak and present resident memory (see the module's docstring for the sources)."""
    try:
        with open(_STATUS, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return ProcessMemory(_ru_maxrss_bytes(), None, "getrusage ru_maxrss")
    peak, rss = status_bytes(text, "VmHWM"), status_bytes(text, "VmRSS")
    if peak is None:
        return ProcessMemory(_ru_maxrss_bytes(), rss, "getrusage ru_maxrss")
    return ProcessMemory(peak, rss, f"{_STATUS} VmHWM")
