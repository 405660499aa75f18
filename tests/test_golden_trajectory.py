"""The default path's numbers, held: the main job's seed 0 over its first 3 steps against the recorded trajectory
(every non-timing metric of every agent, to 1e-6; tests/golden_trajectory.py says how it is recorded).

A failure means the default path now computes something else, so the README's and ``benchmarks/results/tiny_*``
numbers are no longer this code's: regenerate them and this file in the same commit. On a machine with another CPU
or torch kernel capability than the recorded one the last bits of the first steps differ and RL amplifies them, so
the comparison is skipped there, naming both machines.
"""
from __future__ import annotations

import json

import pytest

from golden_trajectory import GOLDEN_FILE, REGENERATE, differences, machine, run_main_job, trajectory


@pytest.mark.e2e
def test_the_main_job_repeats_its_recorded_first_steps(tmp_path):
    golden = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))
    here = machine()
    recorded = golden["machine"]
    if (here["cpu"], here["cpu_capability"], here["torch"]) != (recorded["cpu"], recorded["cpu_capability"],
                                                                 recorded["torch"]):
        pytest.skip(f"recorded on {recorded}, this machine is {here}: another machine rounds differently")
    got = trajectory(run_main_job(tmp_path / "run"))
    assert sorted(got) == [str(s) for s in range(1, 4)]
    diffs = differences(golden["steps"], got)
    assert not diffs, (
        f"the main job's seed-0 steps 1-3 differ from {GOLDEN_FILE.name} (recorded at {golden['commit'][:12]}) in "
        f"{len(diffs)} values, e.g. " + "; ".join(diffs[:5]) + ". The default path computes something else now: "
        f"regenerate the tables (benchmarks/compare_tiny.py, the README's numbers) and this file ({REGENERATE}) in "
        "the same commit.")
    # the check can fail: a value moved by more than the tolerance is found
    step, agent = "1", next(iter(golden["steps"]["1"]))
    key = next(iter(golden["steps"][step][agent]))
    moved = json.loads(json.dumps(got))
    moved[step][agent][key] += 10 * golden["tolerance"] * max(1.0, abs(moved[step][agent][key]))
    assert differences(golden["steps"], moved)
