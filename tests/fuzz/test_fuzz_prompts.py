"""Fuzzing the prompt files (``--prompt_data`` / ``--eval_data``): JSONL and JSON, nesting depth, encodings, sizes,
missing and extra keys, fields of every JSON type.

Property: a file loads into the records written, or raises ``ValueError`` / ``FileNotFoundError`` naming the file
and the line (text errors) or the record and field (content errors); never a raw exception.
"""
from __future__ import annotations

import itertools
import json
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from openrlhf_hacpo.data.prompts import load_prompt_dataset

from fuzz_support import fuzz, message_names

_COUNTER = itertools.count()

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": TEXT}),
                    min_size=1, max_size=3)
ODD_MESSAGES = st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]),
                                        st.none() | st.integers(0, 3) | TEXT | st.lists(TEXT, max_size=1)),
                        max_size=3)
# labels with their text, written by hand: str as is, int as digits, a float as its shortest form
LABELS = st.one_of(
    TEXT.map(lambda s: (s, s)),
    st.integers(-10**6, 10**6).map(lambda i: (i, str(i))),
    st.sampled_from([(0.5, "0.5"), (2.0, "2"), (-1.25, "-1.25"), (1e-07, "1e-07"), (100.0, "100")]),
)
JSON_SCALARS = st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.floats(allow_nan=False,
                                                                                   allow_infinity=False) | TEXT
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
EXTRA_KEYS = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6).filter(
    lambda k: k not in ("input", "label", "prompt_id")), JSON_VALUES, max_size=3)


def _path(tmp_path, suffix: str):
    return tmp_path / f"prompts{next(_COUNTER)}{suffix}"


@st.composite
def good_rows(draw):
    """Valid records and what loading them must give: (rows, [(prompt, label text, metadata)])."""
    n = draw(st.integers(1, 12))
    rows, expected = [], []
    for _ in range(n):
        prompt = draw(TEXT | MESSAGES)
        label, text = draw(LABELS)
        extra = draw(EXTRA_KEYS)
        rows.append({"input": prompt, "label": label, **extra})
        expected.append((prompt, text, extra))
    return rows, expected


def _write(path, rows, layout: str, encoding: str, ensure_ascii: bool) -> None:
    if layout == "jsonl":
        text = "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in rows)
    elif layout == "list":
        text = json.dumps(rows, ensure_ascii=ensure_ascii, indent=1)
    else:
        text = json.dumps({"train": rows}, ensure_ascii=ensure_ascii)
    path.write_bytes(text.encode(encoding))


@given(data=good_rows(), layout=st.sampled_from(["jsonl", "list", "split"]),
       encoding=st.sampled_from(["utf-8", "utf-8-sig"]), ensure_ascii=st.booleans())
@fuzz()
def test_valid_records_load_as_written(tmp_path, data, layout, encoding, ensure_ascii):
    rows, expected = data
    path = _path(tmp_path, ".jsonl" if layout == "jsonl" else ".json")
    _write(path, rows, layout, encoding, ensure_ascii)
    records = load_prompt_dataset(path)
    assert [(r.prompt, r.label, r.metadata) for r in records] == expected
    assert [r.prompt_id for r in records] == [f"{path.stem}:{i}" for i in range(len(rows))]


@given(rows=st.lists(st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["input", "label", "prompt_id", "x"]),
                                                             JSON_VALUES, max_size=4)), max_size=6),
       suffix=st.sampled_from([".jsonl", ".json"]))
@fuzz()
def test_records_of_any_json_shape_load_or_name_the_record(tmp_path, rows, suffix):
    path = _path(tmp_path, suffix)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) if suffix == ".jsonl" else json.dumps(rows))
    try:
        records = load_prompt_dataset(path)
    except ValueError as err:
        message_names(err, path)
        return
    assert len(records) == len(rows)
    for record, row in zip(records, rows):
        assert record.prompt == row["input"] and isinstance(record.label, str)


FIELD_VALUES = st.one_of(JSON_VALUES, MESSAGES, ODD_MESSAGES,
                         st.sampled_from([float("nan"), float("inf"), -float("inf")]))


@given(n=st.integers(1, 6), data=st.data(), field=st.sampled_from(["input", "label", "prompt_id"]),
       value=FIELD_VALUES)
@example(n=1, data=None, field="label", value=float("nan"))
@example(n=2, data=None, field="input", value=None)
@example(n=1, data=None, field="prompt_id", value=[1, 2])
@example(n=1, data=None, field="input", value=[{"role": "user", "content": None}])
@fuzz()
def test_one_odd_field_is_accepted_as_text_or_named(tmp_path, n, data, field, value):
    """One record's input, label or prompt_id replaced by any JSON value (NaN and infinities included)."""
    bad = data.draw(st.integers(0, n - 1)) if data is not None else n - 1
    rows = [{"input": f"q{i}", "label": str(i)} for i in range(n)]
    rows[bad][field] = value
    path = _path(tmp_path, ".jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # NaN / Infinity: Python's JSON extension
    try:
        records = load_prompt_dataset(path)
    except ValueError as err:
        message_names(err, path, f"record {bad}", field)
        return
    odd = records[bad]
    if field == "input":  # text, or chat messages with a string role and string content
        assert odd.prompt == value
        assert isinstance(value, str) or all(isinstance(m["role"], str) and isinstance(m["content"], str)
                                             for m in value)
    elif field == "label":
        assert isinstance(odd.label, str) and value is not None and not isinstance(value, bool)
        assert value == value and value not in (float("inf"), -float("inf"))  # NaN / inf labels are refused
    elif value is None:  # no id of its own: file stem and index
        assert odd.prompt_id == f"{path.stem}:{bad}"
    else:
        assert odd.prompt_id == str(value) and isinstance(value, (str, int)) and not isinstance(value, bool)


@given(n=st.integers(1, 5), data=st.data(), missing=st.sampled_from(["input", "label"]))
@fuzz(0.3)
def test_a_missing_key_names_the_record_and_key(tmp_path, n, data, missing):
    bad = data.draw(st.integers(0, n - 1))
    rows = [{"input": f"q{i}", "label": str(i)} for i in range(n)]
    del rows[bad][missing]
    path = _path(tmp_path, ".jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as info:
        load_prompt_dataset(path)
    message_names(info.value, path, f"record {bad} has no", repr(missing))


# ------------------------------------------------------------------------------------------------ nesting depth
def _nested_file(path, depth: int, line: int, bracket: str) -> None:
    """Valid records on lines 1 .. line-1, then ``depth`` nested brackets on ``line`` (then one more record)."""
    open_, close = bracket
    nested = (open_ + '"k":') * (depth - 1) + open_ + close * depth if open_ == "{" else open_ * depth + close * depth
    good = ['{"input": "q%d", "label": "%d"}' % (i, i) for i in range(line - 1)]
    if path.suffix == ".jsonl":
        text = "\n".join([*good, nested, '{"input": "x", "label": "1"}']) + "\n"
    else:
        text = "[" + "".join(g + ",\n" for g in good) + nested + "]"
    path.write_text(text)


@given(extra=st.integers(100, 15_000), line=st.integers(1, 4), suffix=st.sampled_from([".jsonl", ".json"]),
       bracket=st.sampled_from(["[]", "{}"]))
@fuzz(0.3)
def test_deeply_nested_json_names_the_file_and_line(tmp_path, extra, line, suffix, bracket):
    """Nesting past the interpreter's recursion limit (Hypothesis raises that limit while it runs a test, so the
    depth is relative to it): a ValueError naming file and line."""
    path = _path(tmp_path, suffix)
    _nested_file(path, sys.getrecursionlimit() + extra, line, bracket)
    with pytest.raises(ValueError) as info:
        load_prompt_dataset(path)
    message_names(info.value, f"{path}:{line}:", "nested too deeply")


@pytest.mark.parametrize("suffix, line", [(".jsonl", 2), (".json", 1), (".json", 3)])
def test_a_few_thousand_nested_brackets_name_the_file_and_line(tmp_path, suffix, line):
    """Regression: 3000 nested brackets raised a bare RecursionError naming neither file nor line."""
    path = tmp_path / f"deep{suffix}"
    _nested_file(path, 3_000, line, "[]")
    with pytest.raises(ValueError) as info:
        load_prompt_dataset(path)
    message_names(info.value, f"{path}:{line}:", "nested too deeply")


def test_deep_but_parseable_nesting_in_a_field_loads():
    """Nesting the parser accepts (200 levels in an extra field) loads, and the value is kept."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "deep.jsonl"
        path.write_text(json.dumps({"input": "q", "label": "1", "tree": json.loads("[" * 200 + "]" * 200)}) + "\n")
        (record,) = load_prompt_dataset(path)
        depth, node = 0, record.metadata["tree"]
        while node:
            node, depth = node[0], depth + 1
        assert depth == 199


# ------------------------------------------------------------------------------------------------ encodings
ENCODINGS = ["latin-1", "cp1252", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8", "utf-8-sig"]


@given(prompts=st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, blacklist_categories=("Cs",)),
                                 min_size=1, max_size=8), min_size=1, max_size=4),
       encoding=st.sampled_from(ENCODINGS), suffix=st.sampled_from([".jsonl", ".json"]))
@example(prompts=["café"], encoding="latin-1", suffix=".jsonl")
@example(prompts=["x"], encoding="utf-16", suffix=".json")
@fuzz()
def test_encodings_load_as_utf8_or_name_file_and_line(tmp_path, prompts, encoding, suffix):
    rows = [{"input": p, "label": "1"} for p in prompts]
    text = ("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) if suffix == ".jsonl"
            else json.dumps(rows, ensure_ascii=False))
    try:
        data = text.encode(encoding)
    except UnicodeEncodeError:
        data = text.encode("utf-8")
    path = _path(tmp_path, suffix)
    path.write_bytes(data)
    as_utf8 = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    try:
        readable = as_utf8.decode("utf-8") == text
    except UnicodeDecodeError:
        readable = False
    try:
        records = load_prompt_dataset(path)
    except ValueError as err:
        assert not readable, f"a UTF-8 file was refused: {err}"
        message_names(err, path)
        assert str(err).startswith(f"{path}:"), str(err)  # file:line
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            assert "UTF-16" in str(err) or "UTF-32" in str(err), str(err)
        return
    assert readable or text.isascii(), "a file that is not UTF-8 loaded"
    assert [r.prompt for r in records] == prompts


@given(n=st.integers(1, 6), data=st.data(), byte=st.sampled_from([b"\xff", b"\xe9", b"\xc3", b"\x80", b"\xed\xa0\x80"]))
@fuzz(0.5)
def test_an_invalid_utf8_byte_names_its_line(tmp_path, n, data, byte):
    bad = data.draw(st.integers(0, n - 1))
    lines = [json.dumps({"input": f"q{i}", "label": str(i)}).encode() for i in range(n)]
    lines[bad] = lines[bad].replace(b"q", b"q" + byte, 1)
    path = _path(tmp_path, ".jsonl")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError) as info:
        load_prompt_dataset(path)
    message_names(info.value, f"{path}:{bad + 1}:", "UTF-8")


# ------------------------------------------------------------------------------------------------ sizes and bytes
@given(n=st.integers(0, 300), blank_every=st.integers(0, 5))
@fuzz(0.3)
def test_sizes_and_blank_lines(tmp_path, n, blank_every):
    lines = []
    for i in range(n):
        lines.append(json.dumps({"input": f"q{i}", "label": str(i)}))
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    path = _path(tmp_path, ".jsonl")
    path.write_text("\n".join(lines))
    if n == 0:
        with pytest.raises(ValueError) as info:
            load_prompt_dataset(path)
        message_names(info.value, path, "empty")
        return
    records = load_prompt_dataset(path)
    assert [r.label for r in records] == [str(i) for i in range(n)]


@given(raw=st.binary(max_size=200), suffix=st.sampled_from([".jsonl", ".json", ".parquet"]))
@example(raw=b"PAR1\x00\x00PAR1", suffix=".parquet")
@example(raw=b'[{"input": "a", "label": 1' + b"0" * 5000 + b"}]", suffix=".json")
@fuzz()
def test_arbitrary_bytes_load_or_name_the_file(tmp_path, raw, suffix):
    path = _path(tmp_path, suffix)
    path.write_bytes(raw)
    try:
        records = load_prompt_dataset(path)
    except ValueError as err:
        message_names(err, path)
        return
    assert records and all(isinstance(r.prompt, (str, list)) and isinstance(r.label, str) for r in records)


@given(name=st.text(min_size=1, max_size=30))
@example(name="bad\x00name.jsonl")
@fuzz(0.5)
def test_odd_names_are_a_clear_error(tmp_path, name):
    """A missing file, a name with a NUL byte, a name that is not a hub id: FileNotFoundError / ValueError."""
    path = str(tmp_path / name.lstrip("/")) if "\x00" not in name else name  # NUL: refused before any lookup
    with pytest.raises((FileNotFoundError, ValueError)) as info:
        load_prompt_dataset(path)
    assert str(info.value)
