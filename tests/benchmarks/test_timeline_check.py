"""benchmarks/timeline_check.py on hand-made run folders: every expected figure computed by hand in the comments."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import timeline_check  # noqa: E402


def _step(step, measured, rollout_phase, train_phase):
    common = {"step": step, "time/step": measured, "time/rollout_phase": rollout_phase,
              "time/train_phase": train_phase, "time/reward": 0.05, "time/capability": 0.05, "time/sync": 0.0}
    return [
        {**common, "agent": "a", "time/generate": 1.0, "time/scoring": 0.5, "time/update": 3.0},
        {**common, "agent": "b", "time/generate": 2.0, "time/scoring": 0.25, "time/view": 0.25, "time/probe": 0.5,
         "time/update": 0.25},
    ]


def test_step_check_by_hand():
    check = timeline_check.step_check(_step(3, measured=6.0, rollout_phase=2.5, train_phase=3.2), cores=2,
                                      collect=0.25, dispatch=0.5)
    # costs only: max(1 + 0.5, 2 + 0.25) + 0.1 + max(3, 1) = 5.35; with the dispatch 5.35 + 0.25 + 0.5 = 6.1
    assert check["measured"] == 6.0
    assert check["costs_only"] == pytest.approx(5.35)
    assert check["predicted"] == pytest.approx(6.1)
    # one step off: max(max(1, 0.1 + 0.5 + 3) + 0.5, max(2, 0.1 + 0.5 + 1) + 0.25) + 0.25 = 4.1 + 0.25
    assert check["off_own"] == pytest.approx(4.35)
    # one step off on two shared cores, by hand: the driver's 0.1 and its dispatch 0.5 beside both generations:
    # three processes at 2/3 until the driver's 0.6 of work ends at 0.9 (generations at 0.6 and 0.6 done); then
    # generations (0.4, 1.4 left) and updates (3, 1) at 1/2: a's generation ends at 1.7; then three at 2/3: b's
    # generation (0.6 left) and b's update (0.6 left) end at 2.6; a's update has 3 - 0.4 - 0.6 = 2.0 left, now
    # beside b's scoring (0.25) at full speed: ends at 4.6, a's scoring at 5.1, the collect (0.25) at 5.35
    assert check["off_shared"] == pytest.approx(5.35)


def _write(root: Path, arm: str, rounds: int, steps=(1, 2, 3), measured=lambda step: 6.0 + step,
           rollout_phase=lambda step: 2.5, train_phase=lambda step: 3.2) -> None:
    for r in range(rounds):
        folder = root / arm / f"round{r}"
        folder.mkdir(parents=True)
        rows = [rec for step in steps for rec in _step(step, measured(step), rollout_phase(step), train_phase(step))]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_each_step_is_predicted_with_the_dispatch_of_the_other_steps(tmp_path):
    # steps 2, 3, 4 with rollout phases 2.35, 2.45, 2.75 (collect 0.1, 0.2, 0.5) and train phases 3.1, 3.3, 3.2
    # (dispatch 0.1, 0.3, 0.2): step 2 is predicted with medians of steps 3 and 4: collect 0.35, dispatch 0.25
    _write(tmp_path, "gspo", 1, steps=(1, 2, 3, 4), rollout_phase=lambda s: {1: 9.0, 2: 2.35, 3: 2.45, 4: 2.75}[s],
           train_phase=lambda s: {1: 9.0, 2: 3.1, 3: 3.3, 4: 3.2}[s])
    checks = timeline_check.arm_checks(tmp_path, warmup=1, cores=2)
    first, second, third = checks["gspo"]
    assert (first["collect"], first["dispatch"]) == (pytest.approx(0.35), pytest.approx(0.25))
    assert first["predicted"] == pytest.approx(5.35 + 0.35 + 0.25)
    assert (second["collect"], second["dispatch"]) == (pytest.approx(0.3), pytest.approx(0.15))
    assert (third["collect"], third["dispatch"]) == (pytest.approx(0.15), pytest.approx(0.2))
    with pytest.raises(ValueError, match="arm 'one' has 1 measured step"):
        _write(tmp_path / "x", "one", 1, steps=(1, 2))
        timeline_check.arm_checks(tmp_path / "x", warmup=1, cores=2)


def test_tables_read_every_round_after_the_warmup_and_set_the_overlap_run_beside_the_forecast(tmp_path):
    _write(tmp_path, "gspo", 2)
    _write(tmp_path, "hacpo", 1, steps=(1, 2, 3, 4))
    # the one-step-off run: warm-up (step 1) and last step (5) left out, steps 2-4 measured 4.0, 5.0, 6.0
    _write(tmp_path, "hacpo-overlap", 1, steps=(1, 2, 3, 4, 5), measured=lambda step: 2.0 + step)
    checks = timeline_check.arm_checks(tmp_path, warmup=1, cores=2)
    overlap = timeline_check.overlap_steps(tmp_path, warmup=1)
    assert {arm: len(rows) for arm, rows in checks.items()} == {"gspo": 4, "hacpo": 3}
    assert overlap == {"hacpo": [4.0, 5.0, 6.0]}
    assert sorted(row["measured"] for row in checks["hacpo"]) == [8.0, 9.0, 10.0]
    table = timeline_check.format_tables(checks, overlap, cores=2)
    # hacpo: measured median 9.0; costs only 5.35 (-40.6%); collect 0.25 and dispatch 0.2 on every step (each
    # step's own: 2.5 - 2.25, 3.2 - 3.0): predicted 5.8 (-35.6%)
    assert "| hacpo | 3 | 9.000 | 5.350 | -40.6% | 0.250 | 0.200 | 5.800 | -35.6% |" in table
    # the forecast on two shared cores against the measured median 5.0 of the one-step-off run
    off_shared = checks["hacpo"][0]["off_shared"]
    assert f"| 5.000 | 3 | {off_shared / 5.0 - 1:+.1%} |" in table
    assert "| gspo |" in table.split("\n\n")[1] and "– | – | –" in table
    with pytest.raises(FileNotFoundError, match="no <arm>/round<r>/metrics.jsonl"):
        timeline_check.arm_checks(tmp_path / "none", warmup=1, cores=2)


def test_the_phase_shift_sets_each_agents_medians_side_by_side(tmp_path):
    # synchronous steps 2-4 measured 8, 9, 10 s; the one-step-off run's steps 2-4 (its last, 5, left out) 4, 5, 6 s
    _write(tmp_path, "hacpo", 1, steps=(1, 2, 3, 4))
    _write(tmp_path, "hacpo-overlap", 1, steps=(1, 2, 3, 4, 5), measured=lambda step: 2.0 + step,
           train_phase=lambda step: 6.4)
    _write(tmp_path, "gspo", 1, steps=(1, 2, 3))  # no one-step-off run: not in the table
    shift = timeline_check.phase_shift(tmp_path, warmup=1)
    assert list(shift) == ["hacpo"] and list(shift["hacpo"]) == ["a", "b"]
    a = shift["hacpo"]["a"]
    assert a["time/step"] == (9.0, 5.0) and a["time/train_phase"] == (3.2, 6.4) and a["time/update"] == (3.0, 3.0)
    assert "time/engine_generate" not in a  # not in these records
    table = timeline_check.format_shift(shift)
    assert "| hacpo | a |" in table and "3.200 → 6.400 (2.00×)" in table and "engine_generate" not in table
