"""benchmarks/compare_runs.py: equal training values pass, a changed one fails, timing never fails."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import compare_runs  # noqa: E402


def write(folder: Path, records) -> Path:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def record(step, agent, loss, seconds):
    return {"step": step, "agent": agent, "policy": {"loss": loss}, "time/step": seconds, "reward/mean": 0.5}


def test_same_values_pass_and_timing_is_reported(tmp_path, capsys):
    old = write(tmp_path / "old", [record(1, "a", 0.25, 2.0), record(1, "b", -0.125, 2.0)])
    new = write(tmp_path / "new", [record(1, "a", 0.25, 1.0), record(1, "b", -0.125, 1.0)])
    assert compare_runs.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "| time/step | 2.000 | 1.000 | 0.50 |" in out


def test_a_changed_value_or_a_missing_record_fails(tmp_path, capsys):
    old = write(tmp_path / "old", [record(1, "a", 0.25, 2.0), record(2, "a", 0.5, 2.0)])
    changed = write(tmp_path / "changed", [record(1, "a", 0.25 * (1 + 1e-5), 2.0), record(2, "a", 0.5, 2.0)])
    assert compare_runs.main([str(old), str(changed)]) == 1
    assert "policy/loss 0.25 -> 0.2500025" in capsys.readouterr().out
    assert compare_runs.main([str(old), str(changed), "--rtol", "1e-4"]) == 0
    missing = write(tmp_path / "missing", [record(1, "a", 0.25, 2.0)])
    assert compare_runs.main([str(old), str(missing)]) == 1
    assert "records differ" in capsys.readouterr().out


def test_ignored_and_one_sided_keys(tmp_path, capsys):
    old = write(tmp_path / "old", [record(1, "a", 0.25, 2.0)])
    new_rec = {**record(1, "a", 1.0, 2.0), "perf/rows_backward": 7}
    new = write(tmp_path / "new", [new_rec])
    assert compare_runs.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "policy/loss 0.25 -> 1.0" in out and "perf/rows_backward only in new" in out
    assert compare_runs.main([str(old), str(new), "--ignore", "policy/loss"]) == 1  # the new key still differs
    capsys.readouterr()
    assert compare_runs.main([str(old), str(new), "--ignore", "policy/loss", "--shared_only"]) == 0
    # step and reward/mean are compared; policy/loss is left out, perf/rows_backward is logged by one run only
    assert "2 non-timing numbers compared; left out: policy/loss;" in capsys.readouterr().out
    changed = write(tmp_path / "changed", [{**record(1, "a", 0.25, 2.0), "reward/mean": 0.75, "perf/x": 1}])
    assert compare_runs.main([str(old), str(changed), "--shared_only"]) == 1  # a shared key that differs still fails
