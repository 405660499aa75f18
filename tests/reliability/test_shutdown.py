"""SIGINT and SIGTERM during a Ray run: the driver stops its workers, its reward processes and its Ray session, and
exits with 128 + the signal number; no process of the run is left behind."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fault_inputs import HANGING_REWARD, write_file

pytestmark = pytest.mark.e2e


def _descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _alive(pids: set[int]) -> set[int]:
    import psutil

    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _reward_worker_started(pid: int) -> bool:
    """The run has reached the reward phase of step 1: a spawn-context reward worker is among its descendants."""
    import psutil

    for child in _descendants(pid):
        try:
            if "spawn_main" in " ".join(psutil.Process(child).cmdline()):
                return True
        except psutil.NoSuchProcess:
            continue
    return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_leaves_no_process_of_the_run(tmp_path, run_args, signum):
    reward = write_file(tmp_path, "hangs.py", HANGING_REWARD)
    args = [a for a in run_args(tmp_path / "run", "--reward_timeout", "0", "--step_timeout", "0") if a != "--no_ray"]
    args[args.index("--reward_fn") + 1] = reward
    args[args.index("--reward_num_workers") + 1] = "1"
    driver = subprocess.Popen([sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo", *args], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while not _reward_worker_started(driver.pid):
            assert driver.poll() is None, driver.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run did not reach the reward phase within 300 s"
            seen |= _descendants(driver.pid)
            time.sleep(0.5)
        seen |= _descendants(driver.pid)
        driver.send_signal(signum)
        _, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signum, err[-3000:]
    assert f"interrupted by {signal.Signals(signum).name}" in err, err[-3000:]
    deadline = time.monotonic() + 60
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    import psutil

    left = {pid: " ".join(psutil.Process(pid).cmdline())[:120] for pid in _alive(seen)}
    assert not left, f"processes of the run still alive: {left}; driver's stderr: {err[-3000:]}"
    assert not (tmp_path / "run" / ".run.lock").exists()
