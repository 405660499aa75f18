"""Shared pieces of the fuzzing tests: the active Hypothesis profile and the error check every property makes."""
from __future__ import annotations

import os
from typing import Any

from hypothesis import settings

FUZZ = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
"""The settings of every test in tests/fuzz (profiles registered in tests/fuzz/conftest.py)."""


def fuzz(fraction: float = 1.0) -> settings:
    """The active profile with ``fraction`` of its examples (at least 5), for the costlier properties."""
    return settings(FUZZ, max_examples=max(5, int(FUZZ.max_examples * fraction)))


def message_names(err: BaseException, *names: Any) -> None:
    """Assert that the error message contains every one of ``names`` (file, line, flag, agent, field)."""
    text = str(err)
    for name in names:
        assert str(name) in text, f"{type(err).__name__} message does not name {name!r}: {text}"
