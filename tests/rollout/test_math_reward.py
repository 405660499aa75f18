"""``boxed_exact`` (verl's Hendrycks-MATH reward rules) case by case, next to the math-verify verifier ``boxed_math``.

Each case gives the response, the label, the ``boxed_exact`` verdict derived by hand from the rules in
``openrlhf_hacpo/rollout/math_reward.py`` (the reason is in the last column), and the verdict of math-verify, which
is symbolic and lenient. The rows where the two verdicts differ are the reason the two scores are reported apart.
"""
from __future__ import annotations

import pytest

from openrlhf_hacpo.rollout.math_reward import (
    NormalisationFailed,
    boxed_exact,
    hendrycks_equal,
    hendrycks_normalize,
    last_box,
    unwrap_box,
)
from openrlhf_hacpo.rollout.reward_fns import get_reward_fn, registered_reward_fns
from openrlhf_hacpo.rollout.verifiers import boxed_math

# (response, label, boxed_exact, boxed_math, why boxed_exact gives its verdict)
CASES = [
    # plain answers, several boxes, no box
    ("so \\boxed{42}.", "42", 1, 1, "same string"),
    ("so \\boxed{41}.", "42", 0, 0, "different string"),
    ("The answer is 42.", "42", 0, 0, "no box"),
    ("\\boxed{1} first, then \\boxed{2}", "2", 1, 1, "the last box counts"),
    ("\\boxed{1} first, then \\boxed{2}", "1", 0, 0, "an earlier box does not count"),
    ("\\boxed{3", "3", 0, 0, "unclosed brace: no box"),
    ("\\boxed{}", "0", 0, 0, "empty answer vs '0'"),
    # the space form \boxed 5
    ("hence $\\boxed 5$.", "5", 1, 0, "space form: text after '\\boxed ' up to the next $"),
    ("hence \\boxed 5.", "5", 0, 0, "space form without $ keeps the period: '5.'"),
    ("first \\boxed 3, later \\boxed{4}", "4", 0, 1, "the space form wins over a later brace box"),
    # \fbox and malformed wrappers
    ("\\fbox{7}", "7", 0, 0, "an \\fbox is located but cannot be unwrapped"),
    ("\\boxed{3} and \\fbox{7}", "3", 1, 1, "\\fbox is only looked for when there is no \\boxed"),
    ("\\boxed\\frac{1}{2}", "\\frac{1}{2}", 0, 0, "\\boxed without a brace cannot be unwrapped"),
    # nested braces and fractions
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1, 1, "nested braces kept whole"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1, 1, "dfrac -> frac"),
    ("\\boxed{\\tfrac{3}{4}}", "\\frac34", 1, 1, "tfrac -> frac; \\frac34 -> \\frac{3}{4}"),
    ("\\boxed{\\frac12}", "\\frac{1}{2}", 1, 1, "\\frac12 -> \\frac{1}{2}"),
    ("\\boxed{\\frac1{72}}", "\\frac{1}{72}", 1, 1, "\\frac1{72} -> \\frac{1}{72}"),
    ("\\boxed{\\frac{72}1}", "72", 0, 1, "\\frac{72}1 is not rewritten, no evaluation"),
    ("\\boxed{3/4}", "\\frac{3}{4}", 1, 1, "integer a/b -> \\frac{a}{b}"),
    ("\\boxed{-3/4}", "-\\frac{3}{4}", 0, 1, "-3/4 -> \\frac{-3}{4}, not -\\frac{3}{4}"),
    ("\\boxed{+3/4}", "\\frac{3}{4}", 0, 1, "+3 is not an integer as Python prints it: not rewritten"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 0, 1, "\\pi/2 is not integer/integer: raw strings compared, differ"),
    ("\\boxed{\\pi/2}", "\\pi/2", 1, 1, "\\pi/2 cannot be normalised, the raw strings are equal"),
    ("\\boxed{\\pi / 2}", "\\pi/2", 0, 1, "one slash between non-integers: raw strings compared, spaces kept"),
    ("\\boxed{1.5 / 2}", "1.5/2", 0, 1, "1.5 is not an int(): raw strings compared, spaces kept"),
    # decimals
    ("\\boxed{0.5}", "\\frac{1}{2}", 1, 1, "exactly '0.5' -> \\frac{1}{2}"),
    ("\\boxed{.5}", "\\frac{1}{2}", 1, 1, "leading '.' -> '0.5' -> \\frac{1}{2}"),
    ("\\boxed{0.50}", "\\frac{1}{2}", 0, 1, "only the exact string '0.5' is rewritten"),
    ("\\boxed{0.75}", "\\frac{3}{4}", 0, 1, "no decimal-to-fraction evaluation"),
    ("\\boxed{2.0}", "2", 0, 1, "trailing zeros kept"),
    ("\\boxed{\\frac{.5}{2}}", "\\frac{0.5}{2}", 1, 1, "'{.' -> '{0.'"),
    ("\\boxed{1,000}", "1000", 0, 1, "thousands comma kept"),
    ("\\boxed{1\\!000}", "1000", 1, 1, "\\! removed"),
    # units, degrees, percent, dollars
    ("\\boxed{5\\text{ cm}}", "5", 1, 1, "'\\text{ ' unit dropped"),
    ("\\boxed{5\\text{cm}}", "5", 0, 1, "'\\text{' without a space is not a unit"),
    ("\\boxed{1\\text{ m}\\text{ s}}", "1", 0, 1, "two units: normalisation fails, raw strings differ"),
    ("\\boxed{30^\\circ}", "30", 1, 1, "^\\circ removed"),
    ("\\boxed{30^{\\circ}}", "30", 1, 1, "^{\\circ} removed"),
    ("\\boxed{25\\%}", "25", 1, 1, "\\% removed"),
    ("\\boxed{25%}", "25", 0, 1, "a bare % is kept"),
    # the main branch's verl (math.py) drops \% twice; a later verl (math_reward.py) drops \\% then \%
    ("\\boxed{50\\\\\\%}", "50", 0, 0, "\\\\ -> \\ leaves 50\\\\%, \\% dropped: 50\\ (math_reward.py: 50)"),
    ("\\boxed{5\\\\\\%%}", "5", 1, 0, "the second \\% drop takes the \\% the first one formed (math_reward.py: 5%)"),
    ("\\boxed{\\$10}", "10", 1, 1, "\\$ removed"),
    ("\\boxed{10}", "\\$10", 1, 0, "\\$ removed from the label too"),
    # $-wrapped labels
    ("\\boxed{10}", "$10$", 0, 1, "a $ in the label is compared as written"),
    ("\\boxed{\\frac{1}{2}}", "$\\frac{1}{2}$", 0, 1, "a $ in the label is compared as written"),
    # short prefixes, \left/\right, spaces, \sqrt
    ("\\boxed{x = 3}", "3", 1, 1, "'x ' (2 characters) before the only '=' dropped"),
    ("\\boxed{k=12}", "12", 1, 1, "'k' before the only '=' dropped"),
    ("\\boxed{xy = 3}", "3", 0, 1, "'xy ' is 3 characters: prefix kept"),
    ("\\boxed{x=y=3}", "3", 0, 1, "two '=': prefix kept"),
    ("\\boxed{\\left(1,2\\right)}", "(1,2)", 1, 1, "\\left and \\right removed"),
    ("\\boxed{1, 2, 3}", "1,2,3", 1, 1, "spaces removed"),
    ("\\boxed{(-\\infty, 2]}", "(-\\infty,2]", 1, 1, "spaces removed"),
    ("\\boxed{2\\sqrt3}", "2\\sqrt{3}", 1, 1, "\\sqrt3 -> \\sqrt{3}"),
    ("\\boxed{\\sqrt12}", "\\sqrt{12}", 0, 0, "\\sqrt12 -> \\sqrt{1}2: one character only"),
    # no symbolic equivalence
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 0, 1, "equal values, different strings"),
    ("\\boxed{1+\\sqrt{2}}", "\\sqrt{2}+1", 0, 1, "equal values, different strings"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", 1, 1, "same string"),
]


def test_the_case_table_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert sum(1 for c in CASES if c[2] != c[3]) >= 10


@pytest.mark.parametrize("response,label,expected,_mv,why", CASES, ids=[c[4] for c in CASES])
def test_boxed_exact_verdict(response: str, label: str, expected: int, _mv: int, why: str) -> None:
    assert boxed_exact(response, label) == float(expected), why


@pytest.mark.parametrize("response,label,_be,expected,why", CASES, ids=[c[4] for c in CASES])
def test_math_verify_verdict(response: str, label: str, _be: int, expected: int, why: str) -> None:
    assert boxed_math(response, label) == float(expected), why


@pytest.mark.parametrize(
    "raw,normal",
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("k = \\frac12", "\\frac{1}{2}"),
        ("5\\text{ inches}", "5"),
        ("\\left[ 1, 2 \\right)", "[1,2)"),
        ("3\\sqrt2 + 1", "3\\sqrt{2}+1"),
        ("10/3", "\\frac{10}{3}"),
        ("03/4", "03/4"),
        ("-0/4", "-0/4"),
        ("+3/4", "+3/4"),
        ("50\\\\\\%", "50\\"),
        ("5\\\\\\%%", "5"),
        (" .25", "0.25"),
        (" .5", "\\frac{1}{2}"),
        ("", ""),
        ("a\\\\b", "a\\b"),
        ("\\frac1", "\\frac1"),
    ],
)
def test_normal_forms(raw: str, normal: str) -> None:
    assert hendrycks_normalize(raw) == normal


def test_unnormalisable_strings_compare_raw() -> None:
    # "\\sqrt" and "\\frac" with nothing after them, or two unit markers, make the normalisation fail
    assert hendrycks_equal("2\\sqrt", "2\\sqrt")
    assert not hendrycks_equal("2 \\sqrt", "2\\sqrt")
    assert not hendrycks_equal("\\frac", "\\frac ")
    assert not hendrycks_equal("1\\text{ m}\\text{ s}", "1")
    # one slash between sides that int() cannot read: verl's normalisation raises, the raw strings are compared
    for text in ("\\pi/2", "1.5/2", "/2", "x/"):
        with pytest.raises(NormalisationFailed):
            hendrycks_normalize(text)
    assert hendrycks_equal("x/2", "x/2") and not hendrycks_equal("x / 2", "x/2")


def test_extraction_pieces() -> None:
    assert last_box("a \\boxed{x^{2}} b") == "\\boxed{x^{2}}"
    assert last_box("$\\boxed 12$ and \\boxed{3}") == "\\boxed 12"
    assert last_box("\\fbox{2}") == "\\fbox{2}"
    assert last_box("none") is None
    assert unwrap_box("\\fbox{2}") is None
    assert unwrap_box("\\boxed{x^{2}}") == "x^{2}"


def test_registered_and_needs_a_label() -> None:
    assert "boxed_exact" in registered_reward_fns()
    fn = get_reward_fn("boxed_exact")
    assert fn(["\\boxed{\\dfrac{1}{2}}", "\\boxed{2}"], ["p", "p"], ["0.5", "3"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="boxed_exact needs a label"):
        boxed_exact("\\boxed{1}", None)
