"""Prompt dataset loading (jsonl / json / parquet, errors) and the resumable prompt loader."""
import json

import pytest

from openrlhf_hacpo.data.prompts import PromptDataLoader, PromptRecord, load_prompt_dataset

ROWS = [
    {"input": [{"role": "user", "content": "1+1?"}], "label": "2", "level": 1},
    {"input": "2+2=", "label": 4},
    {"input": "3+3=", "label": "6", "prompt_id": "custom-3"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check_records(records, stem):
    assert [r.prompt_id for r in records] == [f"{stem}:0", f"{stem}:1", "custom-3"]
    assert records[0].prompt == [{"role": "user", "content": "1+1?"}] and records[1].prompt == "2+2="
    assert [r.label for r in records] == ["2", "4", "6"]
    assert records[0].metadata == {"level": 1}


def test_jsonl_json_parquet(tmp_path):
    check_records(load_prompt_dataset(write_jsonl(tmp_path / "train.jsonl", ROWS)), "train")
    (tmp_path / "plain.json").write_text(json.dumps(ROWS))
    check_records(load_prompt_dataset(tmp_path / "plain.json"), "plain")
    (tmp_path / "split.json").write_text(json.dumps({"test": ROWS}))
    check_records(load_prompt_dataset(str(tmp_path / "split.json"), split="test"), "split")
    import pyarrow as pa
    import pyarrow.parquet as pq

    # parquet needs one type per column: messages everywhere
    rows = [{"question": [{"role": "user", "content": f"{i}+{i}?"}], "answer": str(2 * i)} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math.parquet")
    records = load_prompt_dataset(tmp_path / "math.parquet", input_key="question", label_key="answer")
    assert records == [PromptRecord(f"math:{i}", [{"role": "user", "content": f"{i}+{i}?"}], str(2 * i))
                       for i in range(3)]


def test_max_samples_and_unlabelled(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert [r.prompt_id for r in load_prompt_dataset(path, max_samples=2)] == ["d:0", "d:1"]
    assert all(r.label is None for r in load_prompt_dataset(path, label_key=None))


def test_errors_name_file_key_and_record(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"prompt file .*missing\.jsonl does not exist"):
        load_prompt_dataset(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl is empty"):
        load_prompt_dataset(tmp_path / "empty.jsonl")
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ValueError, match=r"d\.jsonl: record 0 has no input key 'prompt'"):
        load_prompt_dataset(path, input_key="prompt")
    write_jsonl(tmp_path / "nolabel.jsonl", [ROWS[0], {"input": "x"}])
    with pytest.raises(ValueError, match=r"nolabel\.jsonl: record 1 has no label key 'label'"):
        load_prompt_dataset(tmp_path / "nolabel.jsonl")
    (tmp_path / "d.csv").write_text("input,label\n")
    with pytest.raises(ValueError, match=r"d\.csv: unsupported prompt file extension '\.csv'"):
        load_prompt_dataset(tmp_path / "d.csv")
    (tmp_path / "bad.jsonl").write_text('{"input": "a", "label": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON"):
        load_prompt_dataset(tmp_path / "bad.jsonl")
    write_jsonl(tmp_path / "dup.jsonl", [{"input": "a", "label": "1", "prompt_id": "x"}] * 2)
    with pytest.raises(ValueError, match="record 1 repeats prompt_id 'x' of record 0"):
        load_prompt_dataset(tmp_path / "dup.jsonl")
    write_jsonl(tmp_path / "badmsg.jsonl", [{"input": [{"text": "hi"}], "label": "1"}])
    with pytest.raises(ValueError, match=r"record 0 field 'input'\[0\] must be a dict with a string 'role'"):
        load_prompt_dataset(tmp_path / "badmsg.jsonl")


def test_unreachable_hub_name_says_so():
    with pytest.raises(FileNotFoundError, match="does not exist locally and could not be loaded from the .* hub"):
        load_prompt_dataset("no-such-owner/no-such-dataset")


# --------------------------------------------------------------------------------------------------- loader
def records(n):
    return [PromptRecord(f"p{i}", f"q{i}", str(i)) for i in range(n)]


def ids(batch):
    return [r.prompt_id for r in batch]


def test_loader_epochs_are_seeded_permutations():
    loader = PromptDataLoader(records(10), batch_size=3, seed=1)
    assert len(loader) == 3
    epoch0 = [ids(loader.next_batch()) for _ in range(3)]
    seen = sum(epoch0, [])
    assert len(set(seen)) == 9 and set(seen) < {f"p{i}" for i in range(10)}  # drop_last skips one record
    epoch1 = [ids(loader.next_batch()) for _ in range(3)]
    assert loader.epoch == 1 and epoch1 != epoch0
    again = PromptDataLoader(records(10), batch_size=3, seed=1)
    assert [ids(again.next_batch()) for _ in range(6)] == epoch0 + epoch1
    other_seed = PromptDataLoader(records(10), batch_size=3, seed=2)
    assert [ids(other_seed.next_batch()) for _ in range(3)] != epoch0


def test_loader_without_shuffle_and_with_tail():
    loader = PromptDataLoader(records(5), batch_size=2, shuffle=False, drop_last=False)
    assert len(loader) == 3
    assert [ids(b) for b in loader] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    assert [ids(b) for b in loader] == [["p0", "p1"], ["p2", "p3"], ["p4"]]  # the next epoch, same order
    with pytest.raises(ValueError, match="batch_size=6 exceeds the 5 records"):
        PromptDataLoader(records(5), batch_size=6)


def test_loader_resume_continues_the_same_order():
    reference = PromptDataLoader(records(7), batch_size=2, seed=3)
    expected = [ids(reference.next_batch()) for _ in range(8)]  # crosses two epoch boundaries
    first = PromptDataLoader(records(7), batch_size=2, seed=3)
    got = [ids(first.next_batch()) for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["epoch"] == 1 and state["position"] == 2
    resumed = PromptDataLoader(records(7), batch_size=2, seed=99)  # the seed comes from the state
    resumed.load_state_dict(state)
    got += [ids(resumed.next_batch()) for _ in range(4)]
    assert got == expected
    with pytest.raises(ValueError, match="num_records=7 but this loader has 8"):
        PromptDataLoader(records(8), batch_size=2).load_state_dict(state)
