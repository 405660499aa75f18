"""Named phases of a step, timed into one mapping (in the spirit of verl's ``marked_timer``).

::

    timer = PhaseTimer()
    with timer.phase("view"):
        ...
    timer.seconds  # {"view": 0.12, ...}; a phase entered twice adds up

Every phase the trainer reports as ``time/<name>`` comes from one of these mappings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = ["PhaseTimer", "slowest", "with_rest"]


class PhaseTimer:
    """Wall seconds per named phase, accumulated over every entry of the phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def start(self, name: str) -> Callable[[], None]:
        """Start phase ``name`` now; the returned function ends it (a phase that spans an asynchronous call, e.g.
        from sending work to reading its results). Ending it twice counts it once."""
        begun = time.perf_counter()
        ended = False

        def stop() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self.add(name, time.perf_counter() - begun)

        return stop

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)


def slowest(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per phase, the longest of several ranks' times (ranks run concurrently; the slowest one is the cost)."""
    out: dict[str, float] = {}
    for part in parts:
        for name, seconds in part.items():
            out[name] = max(out.get(name, 0.0), float(seconds))
    return out


def with_rest(result: Any, name: str, started: float) -> Any:
    """``result`` (a frozen dataclass with ``timings``: the phases one call timed) with ``timings[name]`` added: the
    seconds since ``started`` (``time.perf_counter()`` when the call began) that none of its phases covers
    (planning, reductions, results built), so that the phases and the rest add up to the call."""
    timed = sum(result.timings.values())
    rest = max(time.perf_counter() - started - timed, 0.0)
    return dataclasses.replace(result, timings={**result.timings, name: rest})
