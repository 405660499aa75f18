"""The paper's tables as data, the results JSON, and the comparison table and plot."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_hacpo.cli import table as table_cli
from openrlhf_hacpo.reproduce.metrics import ScoredSample, aggregate_by_data_source
from openrlhf_hacpo.reproduce.paper_tables import (
    COLUMNS,
    HUB_MODEL_IDS,
    MODEL,
    PAPER_ROWS,
    SIZE,
    STATE,
    avg_disagreements,
    paper_model_name,
    paper_rows,
)
from openrlhf_hacpo.reproduce.results import BenchmarkResult, ResultsError, read_results, write_results
from openrlhf_hacpo.reproduce.table import compare, render_markdown, unmatched

SETS = ("math500", "math", "gsm8k", "aime25", "amc23", "minerva", "olympiadbench")


def test_paper_tables_shape_and_spot_values() -> None:
    assert len(PAPER_ROWS) == 80
    assert [len(paper_rows(table=t)) for t in ("1", "2", "3", "7")] == [36, 4, 4, 36]
    assert all(len(r.values) == 7 and all(0 <= v <= 1 for v in r.values) for r in PAPER_ROWS)
    hacpo_17 = [r for r in paper_rows("1", SIZE) if r.model == "Qwen3-1.7B-Base" and r.method == "HACPO"][0]
    assert hacpo_17.values == (0.69, 0.674, 0.822, 0.225, 0.45, 0.279, 0.314)
    assert hacpo_17.value("AIME25") == 0.225
    naive_model = [r for r in paper_rows("1", MODEL) if r.model == "Qwen3-4B-Base" and r.method == "Naive"][0]
    assert naive_model.value("MATH-500") == 0.734  # differs from the size setting's 0.708, as printed
    ablation = [r.method for r in paper_rows("2")] + [r.method for r in paper_rows("3")]
    assert ablation == ["HACPO-Adv", "HACPO", "HACPO-Adv", "HACPO", "HACPO-omega", "HACPO", "HACPO-omega", "HACPO"]


def test_avg_is_recomputed_and_printed_disagreements_are_reported(capsys) -> None:
    base_17 = paper_rows("1", SIZE)[0]
    assert base_17.avg == pytest.approx(2.367 / 7, abs=1e-12)  # 0.5+0.483+0.616+0.033+0.3+0.206+0.229
    off = avg_disagreements()
    for row, diff in off:
        print(f"table {row.table} {row.setting} {row.model} {row.method}: printed {row.printed_avg} "
              f"recomputed {row.avg:.4f} ({diff:+.4f})")
    assert {(r.table, r.setting, r.model, r.method) for r, _ in off} == {
        ("1", STATE, "Qwen3-4B-Instruct", "HACPO"),  # 5.728 / 7 = 0.8183, printed 0.813
        ("1", SIZE, "Qwen3-1.7B-Base", "GSPOx2"),
        ("1", MODEL, "Qwen3-4B-Base", "Naive"),
        ("7", "qwen3-4b-base+qwen3-8b-base", "Qwen3-4B-Base", "Naive"),
        ("7", "qwen3-4b-base+qwen3-8b-base", "Qwen3-4B-Base", "HACPO"),
        ("7", "llama3.2-1b-instruct+llama3.2-3b-instruct", "Llama-3.2-1B-Instruct", "base"),
        ("7", "llama3.2-1b-instruct+llama3.2-3b-instruct", "Llama-3.2-1B-Instruct", "GSPOx2"),
        ("7", "qwen3-1.7b-base+llama3.2-1b-instruct", "Qwen3-1.7B-Base", "GSPOx2"),
        ("7", "qwen3-1.7b-base+llama3.2-1b-instruct", "Llama-3.2-1B-Instruct", "GSPOx2"),
        ("7", "qwen3-1.7b-base+llama3.2-1b-instruct", "Llama-3.2-1B-Instruct", "Naive"),
    }
    instruct = [r for r, _ in off if r.model == "Qwen3-4B-Instruct"][0]
    assert instruct.avg == pytest.approx(5.728 / 7, abs=1e-12)
    assert "printed 0.813" in capsys.readouterr().out


def _result(benchmark: str, value: float, **kw) -> BenchmarkResult:
    fields = dict(run="runs/size-hacpo", setting=SIZE, method="HACPO", model="Qwen3-1.7B-Base", benchmark=benchmark,
                  metric="best@30" if benchmark == "aime25" else "mean@1", value=value,
                  n=30 if benchmark == "aime25" else 1, num_prompts=10)
    fields.update(kw)
    return BenchmarkResult(**fields)


def test_comparison_cells_avg_seeds_base_rows_and_verifier() -> None:
    ours = [0.70, 0.68, 0.80, 0.20, 0.50, 0.30, 0.31]
    results = [_result(s, v) for s, v in zip(SETS, ours)]
    results.append(_result("math500", 0.72, run="runs/size-hacpo-s1"))  # a second seed: math500 is (0.70+0.72)/2
    results.append(_result("gsm8k", 0.5, model="Qwen3-4B-Base", method="base", setting=None))
    results.append(_result("gsm8k", 0.99, verifier="boxed_math"))
    results.append(_result("champ", 0.1, method="base", setting=None, model="SmolLM2-135M-Instruct"))
    rows = compare(results, tables=("1",))
    hacpo = [r for r in rows if r.paper.setting == SIZE and r.paper.model == "Qwen3-1.7B-Base"
             and r.paper.method == "HACPO"][0]
    assert [c.ours for c in hacpo.cells] == pytest.approx([0.71, 0.68, 0.80, 0.20, 0.50, 0.30, 0.31])
    assert hacpo.cells[0].count == 2 and hacpo.cells[2].count == 1  # the boxed_math result is not counted
    assert hacpo.ours_avg == pytest.approx((0.71 + 0.68 + 0.80 + 0.20 + 0.50 + 0.30 + 0.31) / 7)
    assert hacpo.cells[3].delta == pytest.approx(0.20 - 0.225)
    base_rows = [r for r in rows if r.paper.model == "Qwen3-4B-Base" and r.paper.method == "base"]
    assert {r.paper.setting for r in base_rows} == {SIZE, MODEL}
    assert all(r.cells[2].ours == 0.5 and r.cells[0].ours is None and r.ours_avg is None for r in base_rows)

    text = render_markdown(rows)
    line = [ln for ln in text.splitlines() if ln.startswith("| Qwen3-1.7B-Base | HACPO |")][0]
    assert "| 0.710 ×2 / 0.690 (+0.020) |" in line
    assert "| 0.200 / 0.225 (-0.025) |" in line
    assert line.endswith(f"| {(0.71 + 0.68 + 0.80 + 0.20 + 0.50 + 0.30 + 0.31) / 7:.3f} / {hacpo.paper.avg:.3f} "
                         f"({hacpo.ours_avg - hacpo.paper.avg:+.3f}) |")
    assert "| — / 0.500 |" in text and "[printed 0.475]" in text
    assert [r.benchmark for r in unmatched(results)] == ["champ"]

    lenient = compare(results, tables=("1",), verifier="boxed_math")
    assert sum(1 for r in lenient for c in r.cells if c.ours is not None) == 1


def test_a_metric_other_than_the_papers_is_marked() -> None:
    rows = compare([_result("aime25", 0.1, metric="mean@30")], tables=("1",))
    assert "0.100† / 0.225" in render_markdown(rows)


def test_results_file_roundtrip_and_errors(tmp_path: Path) -> None:
    metrics = aggregate_by_data_source(
        [ScoredSample("aime25", f"aime25:{p}", float(i == 0 and p == 0)) for p in range(2) for i in range(4)])
    entry = BenchmarkResult.from_metrics(metrics["aime25"], run="r", setting=None, method="base", model="M",
                                         settings={"temperature": 1.0, "assumptions": ["AIME T=1.0"]})
    assert (entry.metric, entry.n, entry.num_prompts) == ("best@4", 4, 2)
    assert entry.value == metrics["aime25"].best_at_k
    assert entry.metrics["pass@4"] == pytest.approx(0.5)
    greedy = aggregate_by_data_source([ScoredSample("gsm8k", "gsm8k:0", 1.0), ScoredSample("gsm8k", "gsm8k:1", 0.0)])
    g = BenchmarkResult.from_metrics(greedy["gsm8k"], run="r", setting=SIZE, method="GRPO", model="M")
    assert (g.metric, g.value) == ("mean@1", 0.5)

    write_results(tmp_path / "eval" / "a.json", [entry, g])
    (tmp_path / "eval" / "manifest.json").write_text('{"sets": {}}')  # not a results file: skipped in a folder
    assert read_results([tmp_path / "eval"]) == [entry, g]

    bad = json.loads((tmp_path / "eval" / "a.json").read_text())
    del bad["results"][1]["benchmark"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ResultsError, match=r"bad.json: results\[1\] has no field 'benchmark'"):
        read_results([tmp_path / "bad.json"])
    bad["results"][1].update(benchmark="gsm8k", method="PPO")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ResultsError, match=r"results\[1\]: method 'PPO' is not one of"):
        read_results([tmp_path / "bad.json"])
    with pytest.raises(ResultsError, match="not a results file"):
        read_results([tmp_path / "eval" / "manifest.json"])
    with pytest.raises(ResultsError, match="no such results file"):
        read_results([tmp_path / "missing.json"])


def test_cli_writes_markdown_and_plot(tmp_path: Path, capsys) -> None:
    write_results(tmp_path / "r.json", [_result(s, 0.5) for s in SETS]
                  + [_result("champ", 0.0, method="base", setting=None, model="SmolLM2-135M-Instruct")])
    assert table_cli.main(["--results", str(tmp_path / "r.json"), "--tables", "1,2", "--output_dir",
                           str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "### Table 2: qwen3-1.7b-base+qwen3-4b-base" in out
    assert "14 of 280 cells reproduced" in out  # 40 rows x 7 columns; the HACPO row of Table 1 and of Table 2
    assert "| SmolLM2-135M-Instruct | base | champ | mean@1 | 0.000 |" in out
    assert (tmp_path / "out" / "table.md").read_text() in out
    assert (tmp_path / "out" / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table_cli.main(["--tables", "5"]) == 2
    (tmp_path / "broken.json").write_text("{")
    assert table_cli.main(["--results", str(tmp_path / "broken.json")]) == 2
    assert "invalid JSON" in capsys.readouterr().err


def test_paper_model_names() -> None:
    assert paper_model_name("Qwen/Qwen3-4B-Base") == "Qwen3-4B-Base"
    assert paper_model_name("/models/Llama-3.2-3B-Instruct/") == "Llama-3.2-3B-Instruct"
    assert paper_model_name("Qwen/Qwen3-4B-Instruct-2507") == "Qwen3-4B-Instruct"
    assert {r.model for r in PAPER_ROWS} == set(HUB_MODEL_IDS)
    with pytest.raises(ValueError, match="none of the paper's models"):
        paper_model_name("Qwen/Qwen3-4B-Instruct")


def test_columns_follow_the_paper() -> None:
    assert COLUMNS == ("MATH-500", "MATH", "GSM8K", "AIME25", "AMC23", "Minerva", "Olympiad")
