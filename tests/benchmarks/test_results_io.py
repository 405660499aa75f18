"""A failed benchmark run never costs the committed result: the result files are replaced only by a run that
finished, and a failed or cut-short run writes ``<stem>.failed.md`` beside them (benchmarks/results_io.py, and the
benchmarks and checks that write through it)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_kernels  # noqa: E402
import bench_step  # noqa: E402
import gpu_train_check  # noqa: E402
import results_io  # noqa: E402
import throughput  # noqa: E402
from results_io import ResultWriter  # noqa: E402

COMMITTED_MD = "# committed table\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
COMMITTED_JSON = '{"rows": [1, 2]}\n'


def _committed(folder: Path, stem: str, *suffixes: str) -> dict[Path, bytes]:
    """Lay down a committed result (distinct bytes per file); returns each file's bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for suffix in suffixes or (".md", ".json"):
        path = folder / f"{stem}{suffix}"
        path.write_bytes({".md": COMMITTED_MD, ".json": COMMITTED_JSON}.get(suffix, f"committed {suffix}").encode())
        files[path] = path.read_bytes()
    return files


def _unchanged(files: dict[Path, bytes]) -> bool:
    return all(path.read_bytes() == data for path, data in files.items())


def test_a_failing_producer_leaves_the_committed_files_and_records_the_failure_beside_them(tmp_path, capsys):
    committed = _committed(tmp_path, "kernels_cpu")

    def produce():
        raise RuntimeError("CUDA out of memory at 65536x151936")

    with pytest.raises(RuntimeError, match="out of memory"):
        with ResultWriter("kernels_cpu", tmp_path, command="python benchmarks/x.py --quick") as out:
            out.commit(produce())
    assert _unchanged(committed)
    failed = tmp_path / "kernels_cpu.failed.md"
    text = failed.read_text()
    assert text.startswith("# kernels_cpu: failed run")
    assert "RuntimeError: CUDA out of memory at 65536x151936" in text
    assert "`python benchmarks/x.py --quick`" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels_cpu.failed.md", "kernels_cpu.json",
                                                          "kernels_cpu.md"]  # no temporary file left
    assert f"its record is {failed}" in capsys.readouterr().err


def test_a_finished_run_replaces_the_files_and_clears_an_earlier_failure(tmp_path):
    _committed(tmp_path, "step_cpu")
    (tmp_path / "step_cpu.failed.md").write_text("# step_cpu: failed run\n")
    with ResultWriter("step_cpu", tmp_path) as out:
        written = out.commit({".json": {"rows": [3]}, ".md": "# new table", ".png": b"\x89PNG\r\n"})
    assert written == [tmp_path / "step_cpu.json", tmp_path / "step_cpu.md", tmp_path / "step_cpu.png"]
    assert json.loads((tmp_path / "step_cpu.json").read_text()) == {"rows": [3]}
    assert (tmp_path / "step_cpu.md").read_text() == "# new table\n"
    assert (tmp_path / "step_cpu.png").read_bytes() == b"\x89PNG\r\n"
    assert not (tmp_path / "step_cpu.failed.md").exists()


def test_the_figures_of_a_run_that_stops_part_way_are_kept_beside_the_committed_ones(tmp_path):
    committed = _committed(tmp_path, "kernels_gpu")
    with pytest.raises(KeyboardInterrupt):
        with ResultWriter("kernels_gpu", tmp_path) as out:
            out.progress("| shape | ms |\n|---|---|\n| 4096x32000 | 1.5 |")
            assert "incomplete run" in (tmp_path / "kernels_gpu.failed.md").read_text()  # kept if the process dies
            raise KeyboardInterrupt
    assert _unchanged(committed)
    text = (tmp_path / "kernels_gpu.failed.md").read_text()
    assert "KeyboardInterrupt" in text and "| 4096x32000 | 1.5 |" in text


def test_a_payload_that_is_not_strict_json_writes_nothing(tmp_path):
    committed = _committed(tmp_path, "tiny_model", ".md", ".json")
    with pytest.raises(ValueError, match="tiny_model.json"):
        with ResultWriter("tiny_model", tmp_path) as out:
            out.commit({".md": "# new", ".json": {"accuracy": math.nan}})
    assert _unchanged(committed)  # the .md was not written either: every content is serialised first
    assert "ValueError" in (tmp_path / "tiny_model.failed.md").read_text()


def test_a_run_that_ends_without_a_result_is_recorded(tmp_path):
    committed = _committed(tmp_path, "throughput_model")
    with ResultWriter("throughput_model", tmp_path):
        pass
    assert _unchanged(committed)
    assert "the run ended without writing its result" in (tmp_path / "throughput_model.failed.md").read_text()


def test_save_results_writes_a_finished_result(tmp_path):
    results_io.save_results("policy_update_cpu", {"loss": 0.5}, "# update", tmp_path)
    assert json.loads((tmp_path / "policy_update_cpu.json").read_text()) == {"loss": 0.5}
    assert (tmp_path / "policy_update_cpu.md").read_text() == "# update\n"


def test_bench_kernels_failing_part_way_keeps_the_committed_tables(tmp_path, monkeypatch):
    committed = _committed(tmp_path, "loss_fail")
    calls = []

    def bench_loss(meter, device, shapes, peak_tbs):
        calls.append(shapes)
        if len(calls) == 2:
            raise RuntimeError(f"out of memory at {shapes[0][0]}x{shapes[0][1]}")
        return [bench_kernels.Row("loss", "torch_twin", 128, 64, fwd_ms=1.25, step_ms=2.5, extra={"rows": 2})]

    monkeypatch.setattr(bench_kernels, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(bench_kernels, "bench_loss", bench_loss)
    with pytest.raises(RuntimeError, match="out of memory at 1x128"):
        bench_kernels.main(["--only", "loss", "--cpu-small", "--quick", "--loss-shapes", "2x64,1x128",
                            "--out", "loss_fail"])
    assert _unchanged(committed)
    text = (tmp_path / "loss_fail.failed.md").read_text()
    assert "RuntimeError: out of memory at 1x128" in text
    assert "## Figures measured before the failure" in text and "torch_twin" in text and "1.25" in text


def test_bench_step_failing_part_way_keeps_the_committed_tables(tmp_path, monkeypatch):
    committed = _committed(tmp_path, "step_fail")
    calls = []

    def measure(case, timeout_s, in_process=False):
        calls.append(case)
        if len(calls) == 2:
            raise RuntimeError(f"child process of {case.model}/{case.pass_name}/{case.path} died")
        return bench_step.Result(case.model, case.pass_name, case.path, case.shape.tokens, 0, seconds=0.125)

    monkeypatch.setattr(bench_step, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(bench_step, "measure", measure)
    with pytest.raises(RuntimeError, match="child process of .* died"):
        bench_step.main(["--cpu", "--quick", "--in-process", "--models", "zoo", "--out", "step_fail"])
    assert _unchanged(committed)
    text = (tmp_path / "step_fail.failed.md").read_text()
    assert "RuntimeError: child process of zoo/" in text
    figures = text.split("## Figures measured before the failure", 1)[1]
    assert "zoo" in figures and "0.12" in figures  # the first case's row, its 0.125 s as the table prints it


def test_throughput_without_runs_keeps_the_committed_tables(tmp_path, capsys):
    committed = _committed(tmp_path / "results", "throughput_model", ".md", ".json", ".png")
    code = throughput.main(["--report_only", "--runs_dir", str(tmp_path / "runs"),
                            "--results_dir", str(tmp_path / "results")])
    assert code == 2 and _unchanged(committed)
    failed = tmp_path / "results" / "throughput_model.failed.md"
    assert "no run at" in failed.read_text()
    assert str(failed) in capsys.readouterr().err


def test_gpu_train_check_with_a_failed_check_keeps_the_previous_report(tmp_path, monkeypatch, capsys):
    report = tmp_path / "results" / "gpu_train_check.md"
    committed = _committed(report.parent, "gpu_train_check", ".md")

    def check(device, out, bf16, tolerance, offload=True):
        result = gpu_train_check.Report(device)
        result.add("train", True, "3 steps")
        result.add("resume = uninterrupted (llama)", False, "loss differs by 3e-2")
        return result

    monkeypatch.setattr(gpu_train_check, "check", check)
    monkeypatch.setattr(gpu_train_check, "environment", lambda: "torch x | no CUDA device")
    assert gpu_train_check.main(["--device", "cpu", "--out", str(tmp_path / "run"), "--report", str(report)]) == 1
    assert _unchanged(committed)
    text = (report.parent / "gpu_train_check.failed.md").read_text()
    assert "failed checks: resume = uninterrupted (llama)" in text
    assert "| resume = uninterrupted (llama) | FAILED | loss differs by 3e-2 |" in text


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
def test_gpu_check_with_a_python_without_torch_writes_its_summary_beside_the_committed_one(tmp_path):
    committed = _committed(tmp_path / "results", "gpu_check", ".md")
    repo_summary = REPO / "benchmarks" / "results" / "gpu_check.md"
    before = _sha(repo_summary)
    bare = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter the venv was made from: no torch
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACPO_") and k != "PYTHONPATH"}
    env.update(PYTHON=str(bare), PARTS="tests", HACPO_RESULTS_DIR=str(tmp_path / "results"))
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _unchanged(committed) and _sha(repo_summary) == before
    failed = tmp_path / "results" / "gpu_check.failed.md"
    assert f"| tests | failed ({bare} cannot import torch, triton and transformers) | 0 |" in failed.read_text()
    assert "No module named 'torch'" in failed.read_text()
    assert f"its summary is in {failed}" in done.stdout
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["gpu_check.failed.md", "gpu_check.md"]
