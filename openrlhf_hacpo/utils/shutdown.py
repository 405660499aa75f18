"""SIGINT and SIGTERM as an exception, so a driver stopped from outside still runs its ``finally`` blocks (stopping
its workers and its Ray session) instead of dying with them left behind."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["RunInterrupted", "signals_raise"]


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
