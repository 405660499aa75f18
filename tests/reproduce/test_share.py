"""reproduce.share: a single-agent baseline trained in one pair fills the same model's cell of a second pair."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.reproduce.paper_tables import MODEL, SIZE
from openrlhf_hacpo.reproduce.results import BenchmarkResult, read_results, write_results
from openrlhf_hacpo.reproduce.share import main, share_results


def _result(model: str, benchmark: str, value: float) -> BenchmarkResult:
    return BenchmarkResult(run="runs/table1/qwen3_1.7b_4b/gspo", setting=SIZE, method="GSPO", model=model,
                           benchmark=benchmark, metric="mean@1", value=value, n=1, num_prompts=500,
                           metrics={"mean@1": value}, settings={"max_new_tokens": 8196})


def test_the_results_of_one_model_are_filed_under_the_other_pair(tmp_path):
    source = tmp_path / "eval" / "qwen3_1.7b_4b" / "gspo"
    write_results(source / "gspo__Qwen3-4B-Base" / "math500.json", [_result("Qwen3-4B-Base", "math500", 0.75)])
    write_results(source / "gspo__Qwen3-4B-Base" / "gsm8k.json", [_result("Qwen3-4B-Base", "gsm8k", 0.875)])
    write_results(source / "gspo__Qwen3-1.7B-Base" / "math500.json", [_result("Qwen3-1.7B-Base", "math500", 0.5)])
    target = tmp_path / "eval" / "qwen3_4b_llama3.2_3b" / "gspo"
    written = share_results(source, "Qwen/Qwen3-4B-Base", "qwen3_4b_llama3.2_3b", target)
    assert sorted(p.name for p in written) == ["gsm8k.json", "math500.json"]
    copies = {r.benchmark: r for r in read_results([target])}
    assert {b: (r.setting, r.model, r.method, r.value) for b, r in copies.items()} == {
        "math500": (MODEL, "Qwen3-4B-Base", "GSPO", 0.75), "gsm8k": (MODEL, "Qwen3-4B-Base", "GSPO", 0.875)}
    assert copies["math500"].settings["shared_from"] == f"run runs/table1/qwen3_1.7b_4b/gspo, setting {SIZE}"
    assert copies["math500"].settings["max_new_tokens"] == 8196
    assert all(p.parent.name == "shared__Qwen3-4B-Base" for p in written)
    # the originals are untouched
    assert {r.setting for r in read_results([source])} == {SIZE}


def test_errors_name_what_is_wrong(tmp_path, capsys):
    write_results(tmp_path / "r" / "a.json", [_result("Qwen3-1.7B-Base", "math500", 0.5)])
    with pytest.raises(ValueError, match=r"no result of Qwen3-4B-Base .*\[.Qwen3-1.7B-Base.\]"):
        share_results(tmp_path / "r", "Qwen3-4B-Base", "qwen3_4b_llama3.2_3b", tmp_path / "o")
    with pytest.raises(ValueError, match="--pair 'nopair'"):
        share_results(tmp_path / "r", "Qwen3-4B-Base", "nopair", tmp_path / "o")
    assert main(["--results", str(tmp_path / "r"), "--model", "Qwen/Qwen3-4B-Base", "--pair",
                 "qwen3_4b_llama3.2_3b", "--output_dir", str(tmp_path / "o")]) == 2
    assert "share: error: no result of Qwen3-4B-Base" in capsys.readouterr().err
