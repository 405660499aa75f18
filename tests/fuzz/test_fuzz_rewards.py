"""Fuzzing a user reward file ``reward_func(queries, prompts, labels)``: what it returns (NaN, infinities, numbers too
large for a float, wrong types and lengths, tensors, dicts), what it raises, and a call that hangs.

Property: the rewards come back as one finite float per sample, or a ``RewardFunctionError`` names the reward file
(and the sample at fault); never a raw exception. The hang is bounded by the runner's own timeout on the in-thread
path (``num_workers=0``), so no process is started.
"""
from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from openrlhf_hacpo.rollout.reward_fns import RewardFunctionError, get_reward_fn
from openrlhf_hacpo.rollout.reward_runner import RewardRunner, RewardTimeoutError

from fuzz_support import fuzz, message_names

_COUNTER = itertools.count()
N = 3  # samples per call

SCALARS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400), st.booleans(), st.none(),
    st.text(max_size=4), st.sampled_from([[], [1.0], {"r": 1}]),
)


def _write_reward(tmp_path, body: str) -> str:
    path = tmp_path / f"reward{next(_COUNTER)}.py"
    path.write_text(body)
    return str(path)


def _expected(values) -> list[float] | None:
    """The rewards a list of Python values must give, worked out by hand: None when any is not a finite real."""
    if len(values) != N:
        return None
    out = []
    for v in values:
        if isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, int):
            if abs(v) > 1.7976931348623157e308:
                return None
            out.append(float(v))
        elif isinstance(v, float) and math.isfinite(v):
            out.append(v)
        else:
            return None
    return out


@given(values=st.lists(SCALARS, min_size=0, max_size=5), wrap=st.sampled_from(["list", "tuple", "dict", "dict_bad"]))
@example(values=[float("nan"), 1.0, 0.0], wrap="list")
@example(values=[float("inf"), 1.0, 0.0], wrap="list")
@example(values=[10**400, 1.0, 0.0], wrap="tuple")
@fuzz()
def test_returned_values_are_finite_floats_or_a_named_error(tmp_path, values, wrap):
    literal = repr(values) if wrap != "tuple" else repr(tuple(values))
    if wrap == "dict":
        literal = "{'rewards': %s, 'extra': 1}" % literal
    elif wrap == "dict_bad":
        literal = "{1: %s, 'scores': 2}" % literal
    path = _write_reward(tmp_path, f"def reward_func(queries, prompts, labels):\n    return {literal}\n")
    fn = get_reward_fn(path)
    expected = None if wrap == "dict_bad" else _expected(values)
    try:
        rewards = fn(["a"] * N, ["q"] * N, ["1"] * N)
    except RewardFunctionError as err:
        assert expected is None, f"valid rewards {values} refused: {err}"
        message_names(err, path)
        return
    assert expected is not None, f"{values} accepted as {rewards}"
    assert rewards == expected and all(type(r) is float for r in rewards)


OTHER_OUTPUTS = [
    "torch.tensor([0.0, 1.0, 0.5])", "torch.tensor([[0.0, 1.0, 0.5]])", "torch.tensor(1.0)",
    "torch.tensor([0.0, float('nan'), 1.0])", "numpy.array([1, 0, 1])", "numpy.array([1.0, numpy.inf, 0.0])",
    "numpy.float64(0.5)", "(x for x in [1.0, 0.0, 1.0])", "None", "'1.0 0.0 1.0'", "Broken()",
    "{'rewards': torch.tensor([1.0, 0.0, 1.0])}", "[fractions.Fraction(1, 3)] * 3", "[decimal.Decimal('1')] * 3",
    "[numpy.int64(2)] * 3", "[complex(1, 0)] * 3",
]
OTHER_EXPECTED = {  # by hand
    "torch.tensor([0.0, 1.0, 0.5])": [0.0, 1.0, 0.5],
    "numpy.array([1, 0, 1])": [1.0, 0.0, 1.0],
    "{'rewards': torch.tensor([1.0, 0.0, 1.0])}": [1.0, 0.0, 1.0],
    "[fractions.Fraction(1, 3)] * 3": [1 / 3] * 3,
    "[numpy.int64(2)] * 3": [2.0] * 3,
}
PRELUDE = """import decimal, fractions
import numpy, torch


class Broken:
    def tolist(self):
        raise RuntimeError("no list")

    def __repr__(self):
        raise RuntimeError("no repr")


def reward_func(queries, prompts, labels):
    return {output}
"""


@pytest.mark.parametrize("output", OTHER_OUTPUTS)
def test_tensors_and_odd_objects(tmp_path, output):
    path = _write_reward(tmp_path, PRELUDE.format(output=output))
    fn = get_reward_fn(path)
    expected = OTHER_EXPECTED.get(output)
    if expected is None:
        with pytest.raises(RewardFunctionError) as info:
            fn(["a"] * N, ["q"] * N, ["1"] * N)
        message_names(info.value, path)
    else:
        assert fn(["a"] * N, ["q"] * N, ["1"] * N) == pytest.approx(expected, rel=0, abs=1e-12)


@given(error=st.sampled_from(["ValueError('bad')", "KeyError('label')", "ZeroDivisionError()", "RecursionError()",
                              "TypeError('x')", "SystemExit(3)", "MemoryError()", "UnicodeDecodeError('utf-8', b'', "
                              "0, 1, 'x')", "AssertionError()"]),
       when=st.sampled_from(["call", "import"]))
@fuzz(0.5)
def test_exceptions_become_reward_errors_naming_the_file(tmp_path, error, when):
    if when == "call":
        body = f"def reward_func(queries, prompts, labels):\n    raise {error}\n"
    else:
        body = f"raise {error}\n\ndef reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n"
    path = _write_reward(tmp_path, body)
    with pytest.raises(RewardFunctionError) as info:
        get_reward_fn(path)(["a"] * N, ["q"] * N, ["1"] * N)
    message_names(info.value, path, error.split("(")[0])


def test_a_hung_reward_is_stopped_by_the_runner_timeout_in_thread(tmp_path):
    """``--reward_timeout`` with ``--reward_num_workers 0``: the caller gets RewardTimeoutError after the timeout; the
    hung call stays in an abandoned daemon thread (it sleeps 3 s here, then ends)."""
    path = _write_reward(tmp_path, "import time\n\ndef reward_func(queries, prompts, labels):\n"
                                   "    time.sleep(3)\n    return [0.0] * len(queries)\n")
    runner = RewardRunner(path, num_workers=0, timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(RewardTimeoutError) as info:
        runner(["a"] * N, ["q"] * N, ["1"] * N)
    assert time.monotonic() - start < 2.5
    message_names(info.value, path, "0.2 s")


def test_function_form_calls_the_named_function(tmp_path):
    """``FILE.py:NAME`` calls NAME; a file whose NAME is missing is refused naming the file and NAME."""
    path = _write_reward(tmp_path, "def score(queries, prompts, labels):\n    return [len(q) - len(p) for q, p in "
                                   "zip(queries, prompts)]\n")
    assert get_reward_fn(f"{path}:score")(["ab", "", "x"], ["q", "q", "q"], [None] * 3) == [2.0, 0.0, 1.0]
    with pytest.raises(RewardFunctionError) as info:
        get_reward_fn(path)
    message_names(info.value, path, "reward_func")
