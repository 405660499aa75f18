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
    check = timeline_check.step_check(_step(3, measured=6.0, rollout_phase=2.5, train_phase=3.2), cores=2)
    # synchronous: max(1 + 0.5, 2 + 0.25) + 0.1 + max(3, 1) = 5.35; one step off: max(max(1, 0.1 + 3) + 0.5,
    # max(2, 0.1 + 1) + 0.25) = 3.6
    assert check["measured"] == 6.0
    assert check["predicted"] == pytest.approx(5.35)
    assert check["rollout_overhead"] == pytest.approx(2.5 - 2.25)
    assert check["train_overhead"] == pytest.approx(3.2 - 3.0)
    # the forecasts add the step's residual, measured 6.0 less predicted 5.35
    assert check["off_own"] == pytest.approx(3.6 + 0.65)
    assert check["gain_own"] == pytest.approx(6.0 / 4.25)
    # one step off on two shared cores, by hand: driver (0.1) and both generations run at 2/3 until 0.15; then the
    # generations (0.9, 1.9 left) and updates (3, 1) at 1/2: a's generation ends at 1.95; then three at 2/3: b's
    # update (0.1 left) ends at 2.1; then b's generation (0.9 left) and a's update (2.0 left) at full speed: b's
    # generation ends at 3.0, b's scoring (0.25) runs beside a's update until 3.25, a's update (0.85 left) ends at
    # 4.1 and a's scoring at 4.6
    assert check["off_shared"] == pytest.approx(4.6 + 0.65)
    assert check["gain_shared"] == pytest.approx(6.0 / 5.25)


def test_arm_checks_read_every_round_after_the_warmup(tmp_path):
    for arm, rounds in (("gspo", 2), ("hacpo", 1)):
        for r in range(rounds):
            folder = tmp_path / arm / f"round{r}"
            folder.mkdir(parents=True)
            rows = [rec for step in (1, 2, 3) for rec in _step(step, 6.0 + step, 2.5, 3.2)]
            (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    checks = timeline_check.arm_checks(tmp_path, warmup=1, cores=2)
    assert {arm: len(rows) for arm, rows in checks.items()} == {"gspo": 4, "hacpo": 2}
    assert sorted(row["measured"] for row in checks["hacpo"]) == [8.0, 9.0]
    table = timeline_check.format_table(checks, cores=2)
    # hacpo: measured median 8.5, predicted 5.35: 5.35 / 8.5 - 1 = -37.1%
    assert "| hacpo | 2 | 8.500 | 5.350 | -37.1% |" in table
    with pytest.raises(FileNotFoundError, match="no <arm>/round<r>/metrics.jsonl"):
        timeline_check.arm_checks(tmp_path / "none", warmup=1, cores=2)
