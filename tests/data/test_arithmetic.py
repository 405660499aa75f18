"""The arithmetic task: exact answers, worked solutions, splits, verifier and jsonl export."""
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openrlhf_hacpo.data import arithmetic as ar
from openrlhf_hacpo.data.arithmetic import (
    LEVELS,
    Problem,
    TaskConfig,
    arithmetic_reward,
    export_jsonl,
    extract_answer,
    make_splits,
    response_text,
    sample_problems,
    worked_addition,
)


def _int_answer(expression: str) -> int:
    """Independent reference: evaluate ``a+b`` / ``a+b-c`` with Python ints."""
    assert re.fullmatch(r"\d+(\+\d+)(-\d+)?", expression), expression
    tokens = re.findall(r"[+-]?\d+", expression)
    return sum(int(t) for t in tokens)


def _check_worked_columns(steps: list[str], a: int, b: int) -> None:
    """Re-derive a+b from the written columns: digits, carries and column sums must all be consistent."""
    da, db = str(a)[::-1], str(b)[::-1]
    assert len(steps) == max(len(da), len(db))
    carry, digits = 0, []
    for i, step in enumerate(steps):
        m = re.fullmatch(r"(\d)\+(\d)(\+1)?=(\d+)", step)
        assert m, step
        x, y, c, total = int(m[1]), int(m[2]), bool(m[3]), int(m[4])
        assert x == (int(da[i]) if i < len(da) else 0) and y == (int(db[i]) if i < len(db) else 0)
        assert c == bool(carry), f"carry mark wrong in {step!r}"
        assert total == x + y + carry
        digits.append(total % 10)
        carry = total // 10
    value = int("".join(map(str, reversed(digits)))) + carry * 10 ** len(digits)
    assert value == a + b


# ------------------------------------------------------------------------------------------------- problems


@pytest.mark.parametrize(
    "problem, worked",
    [
        (Problem(4, (347, 285)), "7+5=12 4+8+1=13 3+2+1=6 =632"),
        (Problem(1, (5, 7)), "5+7=12 =12"),
        (Problem(1, (6, 6)), "6+6=12 =12"),
        (Problem(1, (0, 0)), "0+0=0 =0"),
        (Problem(2, (99, 99)), "9+9=18 9+9+1=19 =198"),
        (Problem(4, (999, 999)), "9+9=18 9+9+1=19 9+9+1=19 =1998"),
        (Problem(3, (47, 85, 39)), "7+5=12 4+8+1=13 132-39=93 =93"),
        (Problem(3, (10, 10, 99)), "0+0=0 1+1=2 20-99=-79 =-79"),
    ],
)
def test_worked_solutions_hand_checked(problem, worked):
    assert response_text(problem) == worked
    assert problem.response("answer") == "=" + worked.rsplit("=", 1)[1]
    assert arithmetic_reward(worked, problem.label) == 1.0


def test_worked_addition_unequal_lengths():
    assert worked_addition(999, 1) == "9+1=10 9+0+1=10 9+0+1=10"
    assert worked_addition(5, 7) == "5+7=12"
    with pytest.raises(ValueError, match="non-negative"):
        worked_addition(-1, 3)


def test_prompt_forms_and_label():
    p = Problem(4, (347, 285))
    assert p.messages == [{"role": "user", "content": "Q: 347+285=?"}]
    assert p.prompt_text == "Q: 347+285=?\nA: "
    assert p.label == "632"
    assert Problem(3, (10, 10, 99)).label == "-79"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_sampled_answers_match_int_arithmetic_and_level_ranges(level):
    spec = LEVELS[level]
    for p in sample_problems([level], min(300, spec.capacity), seed=3):
        assert p.answer == _int_answer(p.expression)
        assert p.label == str(_int_answer(p.expression))
        assert all(spec.low <= x <= spec.high for x in p.operands)
        assert len({len(str(x)) for x in p.operands}) == 1, "operands of one problem have equal length"
        assert arithmetic_reward(response_text(p), p.label) == 1.0
        assert arithmetic_reward(response_text(p, "answer"), p.label) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_worked_addition_columns_are_consistent(a, b):
    _check_worked_columns(worked_addition(a, b).split(" "), a, b)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(LEVELS)), st.integers(0, 2**32))
def test_worked_response_structure(level, seed):
    p = ar.random_problem(level, random.Random(seed))
    parts = response_text(p).split(" ")
    assert parts[-1] == f"={_int_answer(p.expression)}"
    a, b = p.operands[:2]
    if level == 3:
        assert parts[-2] == f"{a + b}-{p.operands[2]}={a + b - p.operands[2]}"
        parts = parts[:-1]
    _check_worked_columns(parts[:-1], a, b)


def test_problem_validation():
    with pytest.raises(ValueError, match="unknown arithmetic level"):
        Problem(7, (1, 2))
    with pytest.raises(ValueError, match="needs 3 operands"):
        Problem(3, (10, 20))
    with pytest.raises(ValueError, match=r"in \[100, 999\]"):
        Problem(4, (999, 1))
    with pytest.raises(ValueError, match="response_format"):
        response_text(Problem(1, (1, 2)), "latex")


# --------------------------------------------------------------------------------------------------- splits


def test_default_splits_sizes_levels_disjoint():
    s = make_splits()
    assert (len(s.train), len(s.validation), len(s.test)) == (10_000, 200, 400)
    assert {p.level for p in s.test} == {4} and {p.level for p in s.validation} == {4}
    for split in (s.train, s.validation, s.test):
        assert len(set(split)) == len(split), "no duplicates inside a split"
    exprs = {name: {p.expression for p in s[name]} for name in ("train", "validation", "test")}
    assert not exprs["train"] & exprs["test"]
    assert not exprs["train"] & exprs["validation"]
    assert not exprs["validation"] & exprs["test"]


def test_splits_deterministic_and_test_independent_of_other_sizes():
    a = make_splits(TaskConfig(seed=5, train_size=300))
    make_splits.cache_clear()
    b = make_splits(TaskConfig(seed=5, train_size=300))
    assert a == b and a is not b
    c = make_splits(TaskConfig(seed=5, train_size=50, validation_size=10))
    assert c.test == a.test
    assert make_splits(TaskConfig(seed=6, train_size=300)).test != a.test


def test_small_level_disjoint_splits_exhaust_exactly():
    cfg = TaskConfig(test_levels=(1,), test_size=40, validation_levels=(1,), validation_size=30,
                     train_levels=(1,), train_size=30)
    s = make_splits(cfg)
    assert len(s.all_problems()) == 100 == LEVELS[1].capacity
    with pytest.raises(ValueError, match="level 1 .* 100 distinct problems"):
        make_splits(TaskConfig(test_levels=(1,), test_size=60, validation_levels=(1,), validation_size=41))


def test_task_config_accepts_level_lists():
    cfg = TaskConfig(train_levels=[1, 2], train_size=10)
    assert cfg.train_levels == (1, 2) and cfg == TaskConfig(train_levels=(1, 2), train_size=10)
    assert {p.level for p in make_splits(cfg).train} == {1, 2}


def test_mixed_levels_split_evenly():
    problems = sample_problems([1, 2, 3, 4], 10, seed=0)
    counts = {lv: sum(p.level == lv for p in problems) for lv in LEVELS}
    assert counts == {1: 3, 2: 3, 3: 2, 4: 2}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"test_size": 0}, "test_size"),
        ({"train_size": -1}, "train_size"),
        ({"validation_levels": (5,)}, "validation_levels"),
        ({"train_levels": ()}, "train_levels"),
        ({"test_levels": (4, 4)}, "test_levels"),
    ],
)
def test_task_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TaskConfig(**kwargs)


# ------------------------------------------------------------------------------------------------- verifier


@pytest.mark.parametrize(
    "response, label, reward",
    [
        ("7+5=12 4+8+1=13 3+2+1=6 =632", "632", 1.0),
        ("=632", "632", 1.0),
        ("= 632", "632", 1.0),
        ("=632\n", "632", 1.0),
        ("  =632  \n", "632", 1.0),
        ("=632</s>", "632", 1.0),
        ("=632<|im_end|>", "632", 1.0),
        ("=632 </s>", "632", 1.0),
        ("=632 trailing words", "632", 1.0),
        ("=632", 632, 1.0),
        ("=-79", "-79", 1.0),
        ("=631", "632", 0.0),
        ("=+632", "632", 0.0),
        ("=0632", "632", 0.0),
        ("=632.0", "632", 0.0),
        ("=6 32", "632", 0.0),
        ("=632x", "632", 0.0),
        ("=632 =633", "632", 0.0),
        ("632", "632", 0.0),
        ("=", "632", 0.0),
        ("=\n", "632", 0.0),
        ("=</s>", "632", 0.0),
        ("", "632", 0.0),
        ("=６３２", "632", 0.0),
        ("=79", "-79", 0.0),
        ("=- 79", "-79", 0.0),
    ],
)
def test_reward_format_variants(response, label, reward):
    assert arithmetic_reward(response, label) == reward


@pytest.mark.parametrize("bad", [None, 632, b"=632", ["=632"], 6.32, "x" * 10_000, "=" * 5000, "1+1=2 " * 400 + "=632"])
def test_reward_malformed_is_zero(bad):
    assert arithmetic_reward(bad, "632") == 0.0
    assert extract_answer(bad) is None or extract_answer(bad) != "632"


def test_reward_rejects_bad_labels():
    with pytest.raises(ValueError, match="label"):
        arithmetic_reward("=1", "  ")
    with pytest.raises(TypeError, match="label"):
        arithmetic_reward("=1", None)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.none(), st.binary(max_size=20), st.integers()), st.integers(-999, 9999))
def test_reward_never_raises_on_garbage(text, answer):
    assert arithmetic_reward(text, str(answer)) in (0.0, 1.0)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.integers(-999, 9999))
def test_reward_reads_text_after_last_equals(prefix, answer):
    label = str(answer)
    assert arithmetic_reward(prefix + "=" + label, label) == 1.0
    assert arithmetic_reward(prefix + "=" + label + "\n", label) == 1.0
    assert arithmetic_reward(prefix.replace("=", "") + label, label) == 0.0  # no '=' at all


# --------------------------------------------------------------------------------------------------- export


def test_export_jsonl_chat_and_text(tmp_path):
    problems = sample_problems([1, 4], 6, seed=1)
    path = export_jsonl(problems, tmp_path / "p.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["label"] for r in rows] == [str(_int_answer(p.expression)) for p in problems]
    assert rows[0]["input"] == [{"role": "user", "content": f"Q: {problems[0].expression}=?"}]
    assert len({r["prompt_id"] for r in rows}) == len(rows)
    assert [r["level"] for r in rows] == [p.level for p in problems]
    text_rows = [json.loads(x) for x in export_jsonl(problems, tmp_path / "t.jsonl", "text").read_text().splitlines()]
    assert text_rows[0]["input"] == f"Q: {problems[0].expression}=?\nA: "
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "t.jsonl"], "no temporary files left"
    with pytest.raises(ValueError, match="prompt_form"):
        export_jsonl(problems, tmp_path / "x.jsonl", "html")


def test_export_cli_writes_three_splits(tmp_path, capsys):
    assert ar.main(["--out", str(tmp_path), "--train-size", "64", "--validation-size", "8", "--test-size", "16",
                    "--train-levels", "1,2,4"]) == 0
    sizes = {n: len((tmp_path / f"{n}.jsonl").read_text().splitlines()) for n in ("train", "validation", "test")}
    assert sizes == {"train": 64, "validation": 8, "test": 16}
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert {r["level"] for r in train} == {1, 2, 4}
    assert not {r["input"][0]["content"] for r in train} & {r["input"][0]["content"] for r in test}
    assert "wrote 64 problems" in capsys.readouterr().out


@pytest.mark.parametrize("prompt_form", ["chat", "text"])
def test_exported_split_loads_as_prompt_dataset(tmp_path, prompt_form):
    from openrlhf_hacpo.data import load_prompt_dataset

    path = export_jsonl("validation", tmp_path / "validation.jsonl", prompt_form)
    records = load_prompt_dataset(path, input_key="input", label_key="label")
    problems = make_splits().validation
    assert [r.label for r in records] == [str(_int_answer(p.expression)) for p in problems]
    assert [r.prompt_id for r in records] == [f"validation-{i:05d}" for i in range(len(problems))]
    first = problems[0]
    expected = first.messages if prompt_form == "chat" else first.prompt_text
    assert records[0].prompt == expected
    assert arithmetic_reward(response_text(first), records[0].label) == 1.0
