"""cli.reproduce_small.write_subset: the prompts of a prepared file that fit every model of the small pair."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from openrlhf_hacpo.cli.reproduce_small import main, write_subset


def _rows(n: int) -> list[dict]:
    # questions of growing length: 1, 4, 7, ... characters of "1+"
    return [{"input": [{"role": "user", "content": "1+" * i + "1"}], "label": str(i + 1), "prompt_id": f"champ:{i}",
             "data_source": "champ"} for i in range(n)]


def _length(folder: str, row: dict) -> int:
    """Prompt tokens as the trainer counts them: chat template with the generation prompt, no added specials."""
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template(row["input"], add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_rows_that_fit_every_model_are_copied_unchanged(tmp_path, tiny_agents):
    models = [tiny_agents["llama"], tiny_agents["qwen"]]
    rows = _rows(12)
    source = tmp_path / "champ.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = [max(_length(m, r) for m in models) for r in rows]
    limit = sorted(lengths)[5]  # six rows fit
    expected = [r for r, n in zip(rows, lengths) if n <= limit]
    assert 0 < len(expected) < len(rows)
    assert write_subset(source, tmp_path / "all.jsonl", models, limit) == len(expected)
    assert [json.loads(x) for x in (tmp_path / "all.jsonl").read_text().splitlines()] == expected
    assert write_subset(source, tmp_path / "two.jsonl", models, limit, max_rows=2) == 2
    assert [json.loads(x) for x in (tmp_path / "two.jsonl").read_text().splitlines()] == expected[:2]


def test_no_fitting_row_is_an_error_naming_the_limit(tmp_path, tiny_agents, capsys):
    source = tmp_path / "champ.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    with pytest.raises(ValueError, match="fits 1 tokens"):
        write_subset(source, tmp_path / "out.jsonl", [tiny_agents["qwen"]], 1)
    assert main(["subset", "--input", str(source), "--output", str(tmp_path / "out.jsonl"), "--models",
                 tiny_agents["qwen"], "--prompt_max_len", "1"]) == 2
    assert "small: error: no prompt of" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_models_output_file_holds_only_the_two_folders(tmp_path, monkeypatch, capsys):
    """A fresh machine's first DeepSpeed import prints a warning to stdout while the zoo agent builds; the file the
    launcher reads holds the two folders and nothing else."""
    import openrlhf_hacpo.cli.reproduce_small as small

    def noisy_build(progress=False):
        print("[WARNING] [real_accelerator.py:199:get_accelerator] Setting accelerator to CPU.")
        return tmp_path / "smollm2", tmp_path / "qwenS"

    monkeypatch.setattr(small, "small_models", noisy_build)
    out = tmp_path / "data" / "models.txt"
    out.parent.mkdir()
    assert main(["models", "--output", str(out)]) == 0
    assert out.read_text().splitlines() == [str(tmp_path / "smollm2"), str(tmp_path / "qwenS")]
    assert "Setting accelerator" in capsys.readouterr().out
