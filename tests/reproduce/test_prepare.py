"""``prepare`` on small synthetic copies of each hub schema (written here, not taken from the real sets)."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openrlhf_hacpo.cli import prepare as prepare_cli
from openrlhf_hacpo.data.prompts import load_prompt_dataset
from openrlhf_hacpo.reproduce.benchmarks import BENCHMARKS, DATASETS, INSTRUCTION, LabelRule, dataset_spec
from openrlhf_hacpo.reproduce.prepare import (
    HubUnavailableError,
    PrepareConfig,
    PrepareError,
    RowCountError,
    apply_overrides,
    prepare,
)

SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."


def _parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def source_dir(tmp_path: Path) -> Path:
    """One tiny made-up copy per hub layout and schema of the protocol's sets."""
    root = tmp_path / "hub"
    lighteval = root / "DigitalLearningGmbH/MATH-lighteval/data"
    _parquet(lighteval / "train-00000-of-00001.parquet", [
        {"problem": "What is 1+1?", "level": "Level 1", "type": "Algebra", "solution": "Clearly $\\boxed{2}$."},
        {"problem": "Half of 1?", "level": "Level 1", "type": "Algebra",
         "solution": "Try $\\boxed{3}$, no: $\\boxed{\\frac{1}{2}}$."},
    ])
    _parquet(lighteval / "test-00000-of-00001.parquet", [
        {"problem": "What is 2+3?", "level": "Level 1", "type": "Algebra", "solution": "It is $\\boxed{5}$."},
    ])
    _jsonl(root / "HuggingFaceH4/MATH-500/test.jsonl", [
        {"problem": "Area of a unit square?\n", "solution": "Area is $\\boxed{1\\text{ cm}^2}$.", "answer": "1",
         "subject": "Geometry", "level": 1, "unique_id": "test/geometry/1.json"},
        {"problem": "Solve x+1=3.", "solution": "So $x = \\boxed{2}$.", "answer": "2",
         "subject": "Algebra", "level": 1, "unique_id": "test/algebra/2.json"},
    ])
    _parquet(root / "openai/gsm8k/main/test-00000-of-00001.parquet", [
        {"question": " Tom has 1,000 apples and buys 234 more. How many? ", "answer": "1000+234=1234\n#### 1,234"},
    ])
    _parquet(root / "openai/gsm8k/socratic/test-00000-of-00001.parquet", [
        {"question": "socratic variant", "answer": "#### 9"},
        {"question": "socratic variant 2", "answer": "#### 8"},
    ])
    _jsonl(root / "math-ai/aime25/test.jsonl", [{"id": 0, "problem": "Find N.", "answer": 70}])
    _jsonl(root / "math-ai/amc23/test.jsonl", [{"id": 0, "question": "Find M.", "answer": 27.0},
                                               {"id": 1, "question": "Find r.", "answer": "\\frac{3}{4}"}])
    _jsonl(root / "math-ai/minervamath/test.jsonl", [{"question": "Speed?", "answer": "3 \\times 10^8"}])
    olympiad = root / "Hothan/OlympiadBench"
    _parquet(olympiad / "OE_TO_maths_en_COMP/train-00000-of-00001.parquet", [
        {"id": 1, "question": "Find x.", "context": None, "final_answer": ["$x=3$"]},
        {"id": 2, "question": "Find y.", "context": "Let y be a number with y^2=4 and y>0.",
         "final_answer": ["$2$", "$-2$"]},
    ])
    _parquet(olympiad / "OE_TO_physics_en_COMP/train-00000-of-00001.parquet", [
        {"id": 9, "question": "physics", "context": None, "final_answer": ["$1$"]},
    ])
    return root


def _fitted(names: list[str], counts: dict[str, int]) -> tuple:
    """The real settings with the expected row counts of the tiny fixtures."""
    return tuple(dataclasses.replace(dataset_spec(n), expected_rows=counts[n]) for n in names)


FIXTURE_ROWS = {"math_train": 2, "math": 1, "math500": 2, "gsm8k": 1, "aime25": 1, "amc23": 2, "minerva": 1,
                "olympiadbench": 2}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_hub_schema_gives_prompt_rows_labels_and_ids(source_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    specs = _fitted(list(FIXTURE_ROWS), FIXTURE_ROWS)
    manifest = prepare(PrepareConfig(output_dir=out, sets=specs, source_dir=source_dir), log=lambda _: None)

    labels = {name: [r["label"] for r in _rows(out / f"{name}.jsonl")] for name in FIXTURE_ROWS}
    assert labels == {
        "math_train": ["2", "\\frac{1}{2}"],  # last box of the solution
        "math": ["5"],
        "math500": ["1\\text{ cm}^2", "2"],  # the box content as written, not the answer column
        "gsm8k": ["1234"],  # after ####, commas removed; the socratic config is not read
        "aime25": ["70"],  # answer column, integer as text
        "amc23": ["27", "\\frac{3}{4}"],  # a whole float is written as an integer
        "minerva": ["3 \\times 10^8"],
        "olympiadbench": ["x=3", "2"],  # first list entry, $ stripped; the physics config is not read
    }
    math500 = _rows(out / "math500.jsonl")
    assert math500[1] == {
        "input": [{"role": "user", "content": "Solve x+1=3." + SUFFIX}],
        "label": "2",
        "prompt_id": "math500:1",
        "data_source": "math500",
    }
    # the question as stored, surrounding whitespace and newlines included (verl's preprocessing strips nothing)
    assert math500[0]["input"][0]["content"] == "Area of a unit square?\n Let's think step by step and output the " \
        "final answer within \\boxed{}."
    assert _rows(out / "gsm8k.jsonl")[0]["input"][0]["content"] == (
        " Tom has 1,000 apples and buys 234 more. How many?  " + INSTRUCTION)
    olympiad = _rows(out / "olympiadbench.jsonl")
    assert olympiad[0]["input"][0]["content"] == "Find x." + SUFFIX
    assert olympiad[1]["input"][0]["content"] == "Let y be a number with y^2=4 and y>0.\nFind y." + SUFFIX
    for name in FIXTURE_ROWS:
        rows = _rows(out / f"{name}.jsonl")
        assert [r["prompt_id"] for r in rows] == [f"{name}:{i}" for i in range(len(rows))]
        assert all(r["data_source"] == name and r["input"][0]["content"].endswith(SUFFIX) for r in rows)

    entry = manifest["sets"]["gsm8k"]
    written = (out / "gsm8k.jsonl").read_bytes()
    assert entry["sha256"] == hashlib.sha256(written).hexdigest()
    assert (entry["rows"], entry["hub_id"], entry["config"], entry["split"], entry["source"]) == (
        1, "openai/gsm8k", "main", "test", "local")
    assert entry["files"] == [str(source_dir / "openai/gsm8k/main/test-00000-of-00001.parquet")]
    assert manifest["sets"]["aime25"]["provenance"] == "community"
    assert manifest["sets"]["math_train"]["provenance"] == "official"
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["instruction"] == INSTRUCTION

    records = load_prompt_dataset(out / "olympiadbench.jsonl")
    assert [r.prompt_id for r in records] == ["olympiadbench:0", "olympiadbench:1"]
    assert records[0].label == "x=3" and records[0].metadata["data_source"] == "olympiadbench"


def test_wrong_row_count_fails_and_keeps_what_was_prepared(source_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    specs = (*_fitted(["aime25"], FIXTURE_ROWS), dataset_spec("math500"))  # math500 expects 500, the copy has 2
    with pytest.raises(RowCountError, match=r"'math500': 2 rows .* expects 500; pass --allow_row_count_mismatch"):
        prepare(PrepareConfig(output_dir=out, sets=specs, source_dir=source_dir), log=lambda _: None)
    assert not (out / "math500.jsonl").exists()
    assert list(json.loads((out / "manifest.json").read_text())["sets"]) == ["aime25"]

    manifest = prepare(PrepareConfig(output_dir=out, sets=(dataset_spec("math500"),), source_dir=source_dir,
                                     allow_row_count_mismatch=True), log=lambda _: None)
    assert set(manifest["sets"]) == {"aime25", "math500"}
    assert manifest["sets"]["math500"]["row_count_matches"] is False
    assert manifest["sets"]["math500"]["expected_rows"] == 500


def test_label_rule_errors_name_the_row(source_dir: Path, tmp_path: Path) -> None:
    _jsonl(source_dir / "HuggingFaceH4/MATH-500/test.jsonl",
           [{"problem": "p", "solution": "\\boxed{1}"}, {"problem": "q", "solution": "no box here"}])
    spec = dataclasses.replace(dataset_spec("math500"), expected_rows=2)
    with pytest.raises(PrepareError, match=r"set 'math500' row 1: field 'solution' has no \\boxed"):
        prepare(PrepareConfig(output_dir=tmp_path / "o", sets=(spec,), source_dir=source_dir), log=lambda _: None)
    spec = dataclasses.replace(spec, question_field="question")
    with pytest.raises(PrepareError, match=r"set 'math500' row 0: question field 'question' is missing"):
        prepare(PrepareConfig(output_dir=tmp_path / "o", sets=(spec,), source_dir=source_dir), log=lambda _: None)


def test_missing_local_copy_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(PrepareError, match=r"no folder .*math-ai/amc23 .*huggingface-cli download"):
        prepare(PrepareConfig(output_dir=tmp_path / "o", sets=(dataset_spec("amc23"),), source_dir=tmp_path),
                log=lambda _: None)
    _jsonl(tmp_path / "math-ai/amc23/train.jsonl", [{"question": "q", "answer": "1"}])
    with pytest.raises(PrepareError, match=r"no .* file for config None and split 'test'.*train.jsonl"):
        prepare(PrepareConfig(output_dir=tmp_path / "o", sets=(dataset_spec("amc23"),), source_dir=tmp_path),
                log=lambda _: None)


def test_unreachable_hub_fails_in_seconds_naming_source_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    start = time.monotonic()
    with pytest.raises(HubUnavailableError, match=r"'math500': the Hugging Face hub is unavailable.*--source_dir"):
        prepare(PrepareConfig(output_dir=tmp_path, sets=(dataset_spec("math500"),), hub_timeout_s=2.0),
                log=lambda _: None)
    assert prepare_cli.main(["--sets", "gsm8k", "--output_dir", str(tmp_path), "--hub_timeout_s", "2"]) == 2
    assert time.monotonic() - start < 10
    assert "--source_dir" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()


def test_offline_mode_fails_in_seconds_naming_source_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = dataclasses.replace(dataset_spec("aime25"), hub_id="hacpo-tests/no-such-dataset")
    start = time.monotonic()
    with pytest.raises(HubUnavailableError, match=r"HF_HUB_OFFLINE is set.*--source_dir"):
        prepare(PrepareConfig(output_dir=tmp_path, sets=(spec,)), log=lambda _: None)
    assert time.monotonic() - start < 30


def test_overrides_change_settings_of_the_named_set_only() -> None:
    aime = dataset_spec("aime25")
    changed = apply_overrides(aime, ["aime25.hub_id=yentinglin/aime_2025", "aime25.expected_rows=30",
                                     "math500.split=train", "aime25.config=none"])
    assert (changed.hub_id, changed.expected_rows, changed.split, changed.config) == (
        "yentinglin/aime_2025", 30, "test", None)
    assert apply_overrides(aime, ["aime25.label_rule=last_box"]).label_rule is LabelRule.LAST_BOX
    with pytest.raises(ValueError, match="not of the form"):
        apply_overrides(aime, ["aime25hub_id=x"])
    with pytest.raises(ValueError, match="unknown data set 'aime24'"):
        apply_overrides(aime, ["aime24.hub_id=x"])
    with pytest.raises(ValueError, match="'metric' is not a setting"):
        apply_overrides(aime, ["aime25.metric=x"])


def test_the_protocol_table() -> None:
    assert [b.name for b in BENCHMARKS] == ["math500", "math", "gsm8k", "aime25", "amc23", "minerva",
                                            "olympiadbench"]
    assert {b.name: b.expected_rows for b in BENCHMARKS} == {
        "math500": 500, "math": 5000, "gsm8k": 1319, "aime25": 30, "amc23": 40, "minerva": 272,
        "olympiadbench": 675}
    assert DATASETS["math_train"].expected_rows == 7500
    assert [b.name for b in BENCHMARKS if b.provenance.value == "community"] == [
        "aime25", "amc23", "minerva", "olympiadbench"]
    assert INSTRUCTION == SUFFIX[1:]


def _champ_installed() -> bool:
    try:
        importlib.metadata.distribution("champ-dataset")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _champ_installed(), reason="the champ-dataset wheel is not installed")
def test_champ_from_the_wheel(tmp_path: Path) -> None:
    assert prepare_cli.main(["--sets", "champ", "--output_dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "champ.jsonl")
    assert len(rows) == 270
    assert len({r["prompt_id"] for r in rows}) == 270 and rows[0]["prompt_id"] == "champ:0"
    assert all(r["label"] and r["input"][0]["content"].endswith(SUFFIX) for r in rows)
    assert json.loads((tmp_path / "manifest.json").read_text())["sets"]["champ"]["source"] == "wheel"
