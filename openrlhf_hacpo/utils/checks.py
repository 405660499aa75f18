"""Field checks shared by the config dataclasses: each raises ``ValueError("<where> must be <rule>, got <value>")``,
where ``where`` names the field (``TrainConfig.rollout.top_p`` style paths, ``agents[1].zero_stage``, ...)."""
from __future__ import annotations

import math
from typing import Any

__all__ = ["fail", "check_int", "check_real", "check_bool", "check_choice", "check_str"]


def fail(where: str, rule: str, value: Any) -> None:
    raise ValueError(f"{where} must be {rule}, got {value!r}")


def check_int(where: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> None:
    """An int (not a bool), at least ``minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        fail(where, "an int", value)
    if minimum is not None and value < minimum:
        fail(where, f">= {minimum}", value)


def check_real(where: str, value: Any, low: float | None = None, high: float | None = None, low_open: bool = False,
               allow_none: bool = False, allow_inf: bool = False) -> None:
    """A number (not a bool, not NaN, finite unless ``allow_inf``) in [low, high] (or (low, high] with ``low_open``)."""
    if value is None and allow_none:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or (math.isinf(value) and not allow_inf)):
        fail(where, "a number" if allow_inf else "a finite number", value)
    if low is not None and (value <= low if low_open else value < low):
        fail(where, f"{'>' if low_open else '>='} {low}", value)
    if high is not None and value > high:
        fail(where, f"<= {high}", value)


def check_bool(where: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        fail(where, "a bool", value)


def check_choice(where: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        fail(where, f"one of {list(choices)}", value)


def check_str(where: str, value: Any, allow_none: bool = False) -> None:
    """A non-empty string."""
    if value is None and allow_none:
        return
    if not isinstance(value, str) or not value:
        fail(where, "a non-empty string", value)
