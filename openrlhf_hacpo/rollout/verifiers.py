"""The built-in per-sample verifiers, ``verifier(response_text, label) -> float``: :func:`exact_match` (the whole
response against the label, numbers compared in :func:`normalize_answer`'s canonical form) and :func:`boxed_math` (the
last ``\\boxed{...}``, :func:`last_boxed_content`, against the label by math-verify).

:mod:`openrlhf_hacpo.rollout.reward_fns` registers them by name, beside ``boxed_exact``
(:mod:`openrlhf_hacpo.rollout.math_reward`) and the arithmetic task's verifier.
"""
from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation

from openrlhf_hacpo.rollout.math_reward import closing_brace

__all__ = ["boxed_math", "exact_match", "last_boxed_content", "normalize_answer"]

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer: stripped; a number loses thousands commas, ``+`` and trailing zeros.

    ``" 1,000.0 "`` → ``"1000"``, ``"42."`` → ``"42"``, ``"-0.50"`` → ``"-0.5"``; non-numbers are only stripped.
    """
    s = str(text).strip()
    candidate = s.replace(",", "")
    if _NUMBER.match(candidate):
        try:
            value = Decimal(candidate)
        except InvalidOperation:  # pragma: no cover - the pattern only admits valid decimals
            return s
        if value == 0:
            return "0"
        out = format(value.normalize(), "f")
        return out.rstrip("0").rstrip(".") if "." in out else out
    return s


def exact_match(response_text: str, label: str | None) -> float:
    """1.0 if the whole response equals the label after :func:`normalize_answer`, else 0.0."""
    if label is None:
        raise ValueError("exact_match needs a label")
    return float(normalize_answer(response_text) == normalize_answer(label))


def last_boxed_content(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` (nested braces allowed), or None."""
    pos = len(text)
    while True:
        pos = text.rfind("\\boxed", 0, pos)
        if pos < 0:
            return None
        i = pos + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            end = closing_brace(text, i)
            if end is not None:
                return text[i + 1 : end]


def boxed_math(response_text: str, label: str | None) -> float:
    """1.0 if the last ``\\boxed{...}`` of the response is mathematically equal to the label (math-verify).

    The label may be bare (``"1/2"``), boxed or in ``$...$``. math-verify's timeouts use ``signal.alarm``, which
    only works in the main thread; elsewhere they are disabled.
    """
    if label is None:
        raise ValueError("boxed_math needs a label")
    content = last_boxed_content(response_text)
    if content is None or not content.strip():
        return 0.0
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = {} if in_main else {"parsing_timeout": None}
    gold_text = label if ("\\boxed" in label or "$" in label) else "\\boxed{" + label + "}"
    gold = parse(gold_text, **timeout)
    pred = parse("\\boxed{" + content + "}", **timeout)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, **({} if in_main else {"timeout_seconds": None})))
