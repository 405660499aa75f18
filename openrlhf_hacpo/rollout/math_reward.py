"""``boxed_exact``: the paper's reward, verl's Hendrycks-MATH reward rules, written for this project.

The official HACPO runs score every benchmark with verl's Hendrycks-MATH reward: extract the last boxed answer,
normalise the answer and the label with the Hendrycks string rules, compare the two strings with ``==``. No symbolic
equivalence. Its quirks decide which responses count as correct, so they are kept exactly.

**Which verl.** The paper's numbers come from the official main branch, whose verl scores MATH-style data with
``verl/utils/reward_score/math.py``; later verl versions (the official ``verl-v1`` branch) ship the same rules as
``math_reward.py`` with one difference, the percent sign (rule 3 below): ``math.py`` removes ``\\%`` twice (the
second pass catches a ``\\%`` that the first one formed, as in ``\\\\%%``), ``math_reward.py`` removes ``\\\\%``
and then ``\\%`` (so ``50\\\\\\%``, which ``math.py`` leaves as ``50\\``, becomes ``50``). This module follows
``math.py``, the version behind the paper's numbers; the distinguishing strings are in the verifier's case table.

**Extraction** (:func:`last_box`, :func:`unwrap_box`)

1. If ``"\\boxed "`` (with a space) occurs anywhere, the answer is the text after its *last* occurrence, up to the
   next ``$`` (``"$\\boxed 5$"`` → ``"5"``). This wins over any brace form, even a later one.
2. Otherwise the answer is the last ``\\boxed``, taken from that occurrence to the brace that closes the first
   ``{`` after it (nested braces counted). ``\\boxed{...}`` unwraps to its content; anything else that starts with
   ``\\boxed`` but not ``\\boxed{`` (``\\boxed\\frac{1}{2}``) fails to unwrap and scores 0.
3. With no ``\\boxed`` at all, the last ``\\fbox{...}`` is located the same way, but only a ``\\boxed`` wrapper can be
   removed, so an ``\\fbox`` answer always scores 0.
4. No box, or an unclosed brace: 0.

**Normalisation** (:func:`hendrycks_normalize`), in this order:

1. drop newlines and ``\\!``; ``\\\\`` → ``\\``; ``tfrac``/``dfrac`` → ``frac``; drop ``\\left``, ``\\right``,
   ``^{\\circ}``, ``^\\circ``, ``\\$``;
2. units: with exactly one ``"\\text{ "`` (with a space), keep only the text before it;
3. drop ``\\%``, then drop ``\\%`` again; ``" ."`` → ``" 0."``, ``"{."`` → ``"{0."``; an empty string stops
   here; a leading ``.`` gets a ``0``;
4. with exactly one ``=`` and at most 2 characters before it (``"k = 3"``, ``"x=3"``), keep the right side;
5. ``\\sqrtX`` → ``\\sqrt{X}`` for the single character X after ``\\sqrt``;
6. remove every space;
7. ``\\fracAB`` → ``\\frac{A}{B}``, ``\\fracA{B}`` → ``\\frac{A}{B}`` (A, B single characters); a ``\\frac`` with
   fewer than 2 characters after it leaves the whole string as it was before this step;
8. the string ``0.5`` (exactly) → ``\\frac{1}{2}``;
9. ``a/b`` (one slash; a and b integers written as Python prints them, so ``-3`` but not ``+3``, ``03`` or ``-0``)
   → ``\\frac{a}{b}``; with one slash and a side that Python's ``int()`` cannot read (``\\pi/2``, ``1.5/2``,
   ``/2``), verl's normalisation raises (below).

Where verl's code raises (two ``"\\text{ "`` units; ``\\sqrt`` or ``\\frac`` with nothing after it, at the end of the
string or right before another one; one slash between sides that are not integers) the comparison falls back to the
raw strings: ``pred == label`` unnormalised. That is :class:`NormalisationFailed` here.

Nothing else is normalised: ``$``, ``%`` without backslash, ``\\text{...}`` without the space, thousands commas,
trailing zeros, ``\\dfrac`` vs ``/`` with non-integers all compare as written.
"""
from __future__ import annotations

import re

__all__ = ["NormalisationFailed", "boxed_exact", "hendrycks_equal", "hendrycks_normalize", "last_box", "unwrap_box"]

_BOXED = "\\boxed"
_BOXED_SPACE = "\\boxed "
_BOXED_BRACE = "\\boxed{"
_FBOX = "\\fbox"
_UNIT = "\\text{ "
_PYTHON_INT = re.compile(r"-?(0|[1-9][0-9]*)")


class NormalisationFailed(Exception):
    """verl's normalisation raises on this string, so the comparison falls back to the raw strings."""


# ------------------------------------------------------------------------------------------------- extraction
def closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` that brings the brace depth counted from ``text[start]`` back to zero, or None."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_box(text: str) -> str | None:
    """The last box of ``text`` with its wrapper (``"\\boxed{1}"``, ``"\\boxed 5"``, ``"\\fbox{2}"``), or None.

    Rules 1-4 of the module docstring; the result still has to go through :func:`unwrap_box`.
    """
    if _BOXED_SPACE in text:
        return _BOXED_SPACE + text.split(_BOXED_SPACE)[-1].split("$")[0]
    start = text.rfind(_BOXED)
    if start < 0:
        start = text.rfind(_FBOX)
        if start < 0:
            return None
    end = closing_brace(text, start)
    return None if end is None else text[start : end + 1]


def unwrap_box(box: str) -> str | None:
    """The answer inside a box from :func:`last_box`: ``\\boxed `` prefix or ``\\boxed{...}`` braces removed.

    None where the wrapper is not one of those two (``\\fbox{...}``, ``\\boxed\\frac{1}{2}``): verl scores it 0.
    """
    if _BOXED_SPACE in box:
        return box[len(_BOXED_SPACE) :] if box.startswith(_BOXED_SPACE) else None
    if box.startswith(_BOXED_BRACE) and box.endswith("}"):
        return box[len(_BOXED_BRACE) : -1]
    return None


# ------------------------------------------------------------------------------------------------- normalisation
def _drop_right_units(s: str) -> str:
    """Rule 2: ``"5\\text{ cm}"`` → ``"5"``; two ``"\\text{ "`` cannot be normalised."""
    parts = s.split(_UNIT)
    if len(parts) > 2:
        raise NormalisationFailed(f"{len(parts) - 1} unit markers")
    return parts[0]


def _brace_sqrt_argument(s: str) -> str:
    """Rule 5: ``\\sqrt3`` → ``\\sqrt{3}``; ``\\sqrt`` with nothing after it cannot be normalised."""
    pieces = s.split("\\sqrt")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if not piece:
            raise NormalisationFailed("\\sqrt without an argument")
        out.append("\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:]))
    return "".join(out)


def _brace_frac_arguments(s: str) -> str:
    """Rule 7: ``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{72}`` → ``\\frac{1}{72}``; ``\\frac{72}1`` stays."""
    pieces = s.split("\\frac")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if not piece:
            raise NormalisationFailed("\\frac without arguments")
        if piece[0] == "{":
            out.append("\\frac" + piece)
        elif len(piece) < 2:
            return s
        elif piece[1] == "{":
            out.append("\\frac{" + piece[0] + "}" + piece[1:])
        else:
            out.append("\\frac{" + piece[0] + "}{" + piece[1] + "}" + piece[2:])
    return "".join(out)


def _integer_slash_to_frac(s: str) -> str:
    """Rule 9: ``"3/4"`` → ``"\\frac{3}{4}"`` when both sides are integers as Python prints them.

    With exactly one slash, a side that ``int()`` rejects cannot be normalised (verl catches only the assertion
    that the sides are printed canonically, not ``int()``'s ValueError); ``+3``, ``03`` and ``-0`` pass ``int()``
    and stay as written.
    """
    parts = s.split("/")
    if len(parts) != 2:
        return s
    for part in parts:
        try:
            int(part)
        except ValueError:
            raise NormalisationFailed(f"{part!r} beside the slash is not an integer") from None
    if all(_PYTHON_INT.fullmatch(p) and p != "-0" for p in parts):
        return "\\frac{" + parts[0] + "}{" + parts[1] + "}"
    return s


def hendrycks_normalize(s: str) -> str:
    """The Hendrycks-MATH normal form of an answer string (rules 1-9 of the module docstring).

    Raises:
        NormalisationFailed: where verl's normalisation raises (the caller then compares raw strings).
    """
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    s = _drop_right_units(s)
    s = s.replace("\\%", "").replace("\\%", "")  # twice, as the main branch's verl (module docstring)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _brace_sqrt_argument(s)
    s = s.replace(" ", "")
    s = _brace_frac_arguments(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _integer_slash_to_frac(s)


def hendrycks_equal(answer: str, label: str) -> bool:
    """``normalize(answer) == normalize(label)``; the raw strings are compared where either cannot be normalised."""
    try:
        return hendrycks_normalize(answer) == hendrycks_normalize(label)
    except NormalisationFailed:
        return answer == label


# ------------------------------------------------------------------------------------------------- verifier
def boxed_exact(response_text: str, label: str | None) -> float:
    """1.0 if the last boxed answer of the response equals the label after Hendrycks normalisation, else 0.0.

    The label is a bare answer (``"\\frac{1}{2}"``), not boxed and not ``$``-wrapped: a ``$`` in it is compared as
    written, so labels are cleaned when the data is prepared.
    """
    if label is None:
        raise ValueError("boxed_exact needs a label")
    box = last_box(response_text)
    answer = None if box is None else unwrap_box(box)
    if answer is None:
        return 0.0
    return float(hendrycks_equal(answer, str(label)))
