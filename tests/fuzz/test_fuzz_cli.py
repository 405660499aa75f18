"""Fuzzing whole ``train_hacpo`` command lines (:func:`build_config`) with flags and values drawn from the real flag
table, and the ``--reward_fn`` value of ``train_hacpo`` and ``evaluate``.

Property: a command line gives a config holding exactly the values typed, or ``ValueError`` naming a flag or field
that was typed, or argparse's exit (status 2) naming the flag; never a raw exception.
"""
from __future__ import annotations

import contextlib
import io
import math
import typing

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from openrlhf_hacpo.cli import evaluate
from openrlhf_hacpo.cli.train_hacpo import _FLAGS, build_config
from openrlhf_hacpo.rollout.reward_fns import registered_reward_fns

from fuzz_support import fuzz, message_names

BASE = ["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--n_samples_per_prompt", "2",
        "--rollout_batch_size", "2", "--train_batch_size", "4", "--micro_train_batch_size", "2"]
NUMBER_TEXT = st.one_of(st.integers(-3, 600).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.sampled_from(["0", "1", "-1", "1e-6", "abc", "", "1.5", "nan", "inf", "0x10", "1_000"]))
FREE_TEXT = st.text(st.characters(min_codepoint=33, max_codepoint=0x7E), min_size=1, max_size=8)


@st.composite
def flag_value(draw, ff):
    """(argv words for the flag, the value the field must then hold, or None when the value is odd)."""
    meta, kind = ff.meta, ff.kind
    if kind is bool:
        if "false_flag" in meta and draw(st.booleans()):
            return [meta["false_flag"]], False
        return [ff.flag], (True if "false_flag" in meta else not ff.default)
    if typing.get_origin(kind) is tuple:
        texts = draw(st.lists(NUMBER_TEXT, min_size=len(typing.get_args(kind)), max_size=len(typing.get_args(kind))))
        return [ff.flag, *texts], _typed_tuple(texts)
    if "join" in meta:
        parts = draw(st.lists(FREE_TEXT, min_size=1, max_size=3))
        return [ff.flag, *parts], meta["join"].join(parts)
    if "choices" in meta:
        text = draw(st.sampled_from([str(c) for c in meta["choices"]]) | FREE_TEXT)
    elif kind in (int, float):
        text = draw(NUMBER_TEXT)
    else:
        text = draw(FREE_TEXT)
    return [ff.flag, text], _typed(text, kind, meta)


def _typed(text: str, kind, meta):
    """The value argparse gives the field (by hand: int(), float(), the text), or None when it refuses it."""
    try:
        value = kind(text) if kind in (int, float) else text
    except ValueError:
        return None
    if meta.get("zero_is_none") and value == 0:
        return "none"
    return value


def _typed_tuple(texts):
    try:
        return tuple(float(t) for t in texts)
    except ValueError:
        return None


def _field(cfg, path):
    node = cfg
    for name in path:
        node = getattr(node, name)
    return node


def _names(ff) -> set[str]:
    names = {ff.flag.lstrip("-"), ff.field.name}
    if "false_flag" in ff.meta:
        names.add(ff.meta["false_flag"].lstrip("-"))
    return names


@given(data=st.data(), picked=st.lists(st.sampled_from(_FLAGS), min_size=1, max_size=6, unique_by=lambda f: f.flag))
@fuzz()
def test_random_command_lines_give_the_typed_values_or_name_a_flag(data, picked):
    argv, expected = list(BASE), {}
    for ff in picked:
        words, value = data.draw(flag_value(ff), label=ff.flag)
        argv += words
        expected[ff] = value
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cfg = build_config(argv)
    except SystemExit as exit_:  # argparse refused a value: status 2, the flag named
        event("refused by argparse")
        assert exit_.code == 2
        assert any(f"argument {ff.flag}" in stderr.getvalue() or ff.flag in stderr.getvalue()
                   or ff.meta.get("false_flag", "@") in stderr.getvalue() for ff in picked), stderr.getvalue()
        return
    except ValueError as err:
        event("refused by the config")
        given_names = set().union(*(_names(ff) for ff in picked)) | {
            "n_samples_per_prompt", "rollout_batch_size", "train_batch_size", "micro_train_batch_size", "agent"}
        assert any(name in str(err) for name in given_names), f"{err} names none of {sorted(given_names)}"
        return
    event("accepted")
    for ff, value in expected.items():
        held = _field(cfg, ff.path)
        if value is None:
            raise AssertionError(f"{ff.flag}: argparse should have refused the value, config holds {held!r}")
        if value == "none":
            assert held is None, (ff.flag, held)
        elif isinstance(value, float) and math.isnan(value):
            raise AssertionError(f"{ff.flag} accepted NaN")
        else:
            assert held == value, (ff.flag, held, value)


# ------------------------------------------------------------------------------------------------ --reward_fn
KNOWN_FORMS = [*registered_reward_fns(), "FILE.py", "FILE.py:FUNCTION"]


@pytest.mark.parametrize("name", ["0.5", "inf", "nan", "3", "gspo", "", "boxed", "reward.py", "x.py:0bad"])
def test_bad_reward_names_are_refused_when_the_command_line_is_parsed(name):
    with pytest.raises(ValueError) as info:
        build_config([*BASE, "--reward_fn", name])
    message_names(info.value, "--reward_fn")
    if name not in ("", "reward.py"):
        message_names(info.value, repr(name), *KNOWN_FORMS)


@given(name=st.text(max_size=12) | st.sampled_from(registered_reward_fns()))
@example(name="gspo")
@fuzz(0.5)
def test_reward_names_are_registered_or_refused(name):
    try:
        cfg = build_config([*BASE, "--reward_fn", name])
    except ValueError as err:
        assert name not in registered_reward_fns()
        message_names(err, "--reward_fn")
        return
    except SystemExit:  # argparse: a value that looks like a flag
        assert name.startswith("-")
        return
    assert cfg.rewards.reward_fn == name and name in registered_reward_fns()


@pytest.mark.parametrize("body, suffix, problem", [
    ("def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n", "", None),
    ("def score(q, p, l):\n    return [0.0] * len(q)\n", ":score", None),
    ("from math import *\n", ":whatever", None),  # a star import may bind anything: left to the import
    ("if True:\n    def reward_func(q, p, l):\n        return [0.0]\n", "", None),
    ("reward_func = lambda q, p, l: [0.0] * len(q)\n", "", None),
    ("def score(q, p, l):\n    return []\n", "", "does not define a function reward_func"),
    ("def reward_func(q, p, l):\n    return []\n", ":score", "does not define a function score"),
    ("x = 1\ndef reward_func(q, p, l)\n    return []\n", "", ":2: "),  # syntax error on line 2
])
def test_reward_files_are_checked_without_importing_them(tmp_path, body, suffix, problem):
    path = tmp_path / "my_reward.py"
    # a good file exits when imported: build_config must only parse it
    path.write_text("raise SystemExit('imported')\n" + body if problem is None else body)
    spec = f"{path}{suffix}"
    if problem is None:
        assert build_config([*BASE, "--reward_fn", spec]).rewards.reward_fn == spec
        return
    with pytest.raises(ValueError) as info:
        build_config([*BASE, "--reward_fn", spec])
    message_names(info.value, "--reward_fn", str(path), problem)


@pytest.mark.parametrize("name", ["gspo", "0.5", "nan", "missing.py"])
def test_evaluate_refuses_bad_reward_names_at_parse_time(name):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as info:
        evaluate.build_parser().parse_args(["--data", "d.jsonl", "--output_dir", "o", "--reward_fn", name])
    assert info.value.code == 2
    assert "argument --reward_fn" in stderr.getvalue() and name in stderr.getvalue()


def test_evaluate_accepts_registered_names_and_files(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def reward_func(q, p, l):\n    return [0.0] * len(q)\n")
    for name in [*registered_reward_fns(), str(path)]:
        args = evaluate.build_parser().parse_args(["--data", "d.jsonl", "--output_dir", "o", "--reward_fn", name])
        assert args.reward_fn == name
