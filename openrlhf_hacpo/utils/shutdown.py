"""SIGINT and SIGTERM as an exception, so a driver stopped from outside still runs its ``finally`` blocks (stopping
its workers and its Ray session) instead of dying with them left behind.

Ray's core worker installs a C-level SIGTERM handler in the driver that aborts the process; :func:`keep_signal_handlers`
around ``ray.init`` puts the driver's own handlers back.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["RunInterrupted", "keep_signal_handlers", "signals_raise"]


class RunInterrupted(BaseException):
    """The process received SIGINT or SIGTERM (a ``BaseException``, so ``except Exception`` does not swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def signals_raise(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Within the block, the given signals raise :class:`RunInterrupted` in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def keep_signal_handlers(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Restore the Python handlers of ``signums`` after the block (for libraries that install their own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in signums}
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)
