"""``tests/run.sh``'s parallel workers: the number it picks, the caller's ``-n`` winning, and a bad
``HACPO_TEST_WORKERS`` refused by name (tests/README.md, "Tests")."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
# two quick unit tests (no DeepSpeed op load); --tier unit, else the script first builds the e2e tier's GPU train check
# op when it is missing (a minute on a fresh clone)
TARGET = ["--tier", "unit", "-p", "no:cacheprovider", "tests/test_op_build.py", "-k", "not installed"]


def run_tests(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "HACPO_TEST_WORKERS"}
    full_env.update(env)
    return subprocess.run(["bash", str(REPO / "tests" / "run.sh"), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=600)


def test_workers_from_the_environment_variable():
    done = run_tests(*TARGET, HACPO_TEST_WORKERS="3")
    assert done.returncode == 0, done.stderr
    assert "[tests] 3 worker process(es)" in done.stderr
    assert "created: 3/3 workers" in done.stdout and "2 passed" in done.stdout


def test_default_is_one_worker_per_cpu_at_most_four():
    done = run_tests(*TARGET)
    assert done.returncode == 0, done.stderr
    cpus = len(os.sched_getaffinity(0))
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        available_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    # the script reads the memory a moment later: allow one worker either side of the memory bound only
    expected = max(1, min(cpus, 4, available_kib // (6 * 1024 * 1024)))
    line = next(line for line in done.stderr.splitlines() if line.startswith("[tests] "))
    workers = int(line.split()[1])
    assert f"created: {workers}/{workers} workers" in done.stdout
    assert workers == expected or (available_kib // (6 * 1024 * 1024) < 4 and abs(workers - expected) <= 1), line


def test_callers_n_wins_and_zero_runs_in_process():
    done = run_tests("-n", "0", *TARGET, HACPO_TEST_WORKERS="3")
    assert done.returncode == 0, done.stderr
    assert "worker process" not in done.stderr and "workers" not in done.stdout and "2 passed" in done.stdout


def test_bad_worker_count_is_refused_by_name():
    done = run_tests(*TARGET, HACPO_TEST_WORKERS="two")
    assert done.returncode == 2
    assert "HACPO_TEST_WORKERS" in done.stderr and "'two'" in done.stderr
