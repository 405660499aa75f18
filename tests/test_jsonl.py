"""The one jsonl reader (openrlhf_hacpo/utils/jsonl.py) and the callers that keep their own names on top of it:
metrics records, prompt files and rollout dumps."""
import pytest

from openrlhf_hacpo.data.prompts import load_prompt_dataset
from openrlhf_hacpo.rollout.store import RolloutStore
from openrlhf_hacpo.utils.jsonl import iter_jsonl, read_jsonl, read_records


def test_values_line_numbers_and_blank_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"x": 1}\n\n   \n[2, "\xc3\xa9"]\n3\n')
    assert list(iter_jsonl(path)) == [(1, {"x": 1}), (4, [2, "é"]), (5, 3)]
    assert read_jsonl(path) == [{"x": 1}, [2, "é"], 3]


def test_bad_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"x": 1}\n{"x": \n{"x": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON line"):
        read_jsonl(path)
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON line"):  # not the last line: not torn
        read_jsonl(path, skip_torn_tail=True)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"x": 1}\n{"x": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl:2: byte 0xe9 at column 11 is not valid UTF-8"):
        read_jsonl(latin)
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl")
    assert read_jsonl(tmp_path / "missing.jsonl", missing_ok=True) == []


def test_torn_tail_is_skipped_only_when_asked(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3, "na')
    assert read_jsonl(path, skip_torn_tail=True) == [{"step": 1}, {"step": 2}]
    with pytest.raises(ValueError, match=r"log\.jsonl:3"):
        read_jsonl(path)
    torn_char = tmp_path / "torn_char.jsonl"
    torn_char.write_bytes(b'{"step": 1}\n{"a": "\xc3')  # cut inside a two-byte character
    assert read_jsonl(torn_char, skip_torn_tail=True) == [{"step": 1}]
    whole = tmp_path / "no_newline.jsonl"
    whole.write_bytes(b'{"step": 1}\n{"step": 2}')  # a complete last line without its newline is kept
    assert read_jsonl(whole, skip_torn_tail=True) == [{"step": 1}, {"step": 2}]


def test_callers_keep_their_behaviour(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert read_records(metrics) == []
    metrics.write_text('{"step": 1, "agent": "a"}\n{"step": 2, "ag')
    assert read_records(metrics) == [{"step": 1, "agent": "a"}]
    metrics.write_text('{"step": 1, "agent": "a"}\nnot json\n{"step": 2, "agent": "a"}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        read_records(metrics)

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n\n{"input": "2+2", "label": 4}\n')
    records = load_prompt_dataset(str(prompts), input_key="input", label_key="label")
    assert [(r.prompt_id, r.prompt, r.label) for r in records] == [("prompts:0", "1+1", "2"),
                                                                    ("prompts:1", "2+2", "4")]

    dump = tmp_path / "step_1.jsonl"
    dump.write_text("\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"step_1\.jsonl:2: not a trajectory record"):
        RolloutStore.read_jsonl(dump)
    dump.write_text('{"prompt_id": "p"\n')
    with pytest.raises(ValueError, match=r"step_1\.jsonl:1: invalid JSON line"):
        RolloutStore.read_jsonl(dump)
