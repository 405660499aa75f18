"""The run lock's heartbeat: a fresh lock of another driver is refused (on this host or another), a stale one is
taken over with a warning, a held lock is refreshed and released only by its owner. Clocks are injected."""
from __future__ import annotations

import json
import logging
import os
import socket
import time

import pytest

from openrlhf_hacpo.trainer.run_folder import LOCK_FILE, STALE_AFTER_S, RunLock, lock_verdict
from openrlhf_hacpo.utils.errors import RunFolderError

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
HERE = "this-host"


def _verdict(earlier, alive=lambda pid: True, now=NOW, stale=180.0):
    return lock_verdict(earlier, now, HERE, 100, alive, "/runs/x/.run.lock", stale)


def _lock(host, pid, beat=None):
    out = {"pid": pid, "host": host, "started": "2027-01-15 07:00:00", "processes": []}
    if beat is not None:
        out["heartbeat"] = beat
    return out


@pytest.mark.parametrize("age", [0.0, 179.0, 180.0, -20.0])  # -20: the other host's clock runs ahead
def test_a_fresh_heartbeat_of_another_host_is_refused_with_host_pid_and_heartbeat(age):
    verdict = _verdict(_lock("gpu-b", 4242, NOW - age))
    assert verdict.action == "refuse"
    assert "driver pid 4242 on host gpu-b" in verdict.reason
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(NOW - age))
    assert f"last heartbeat {stamp}, {max(age, 0):.0f} s ago" in verdict.reason
    assert "remove /runs/x/.run.lock" in verdict.reason and "older than 180 s" in verdict.reason


def test_a_stale_heartbeat_of_another_host_is_taken_over():
    verdict = _verdict(_lock("gpu-b", 4242, NOW - 180.5))
    assert verdict.action == "take_over"
    assert "driver pid 4242 on host gpu-b" in verdict.reason and "stale" in verdict.reason


def test_this_hosts_locks_follow_the_pid_then_the_heartbeat():
    dead = lambda pid: False  # noqa: E731
    assert _verdict(_lock(HERE, 7, NOW - 5), alive=dead).action == "take"  # its driver is gone: no need to wait
    assert _verdict(_lock(HERE, 7, NOW - 5)).action == "refuse"
    assert _verdict(_lock(HERE, 7, NOW - 500)).action == "take_over"  # alive but silent: stopped, or a reused pid
    assert _verdict(_lock(HERE, 7)).action == "refuse"  # no heartbeat (an older lock): a live pid holds it
    assert _verdict(_lock(HERE, 100, NOW - 5)).action == "take"  # this very driver


def test_no_lock_an_unreadable_lock_and_an_old_lock_of_another_host():
    assert _verdict(None).action == "take"
    assert _verdict({}).action == "take_over"
    assert _verdict(_lock("gpu-b", 4242)).action == "take_over"


def test_the_default_staleness_is_documented_as_six_heartbeats():
    assert STALE_AFTER_S == 180.0


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_second_driver_is_refused_then_takes_over_once_the_heartbeat_is_stale(tmp_path, caplog):
    clock = _Clock(NOW)
    first = RunLock(str(tmp_path), clock=clock, heartbeat_s=3600)
    first.acquire()
    held = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (held["pid"], held["host"], held["heartbeat"]) == (os.getpid(), socket.gethostname(), NOW)
    # a driver on another host sees the same folder (the lock names another host, as a lock written there would)
    other = dict(held, host="gpu-b", pid=4242)
    (tmp_path / LOCK_FILE).write_text(json.dumps(other))
    second = RunLock(str(tmp_path), clock=_Clock(NOW + 60), heartbeat_s=3600)
    with pytest.raises(RunFolderError, match=r"another run \(driver pid 4242 on host gpu-b, .*60 s ago"):
        second.acquire()
    late = RunLock(str(tmp_path), clock=_Clock(NOW + 181), heartbeat_s=3600)
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
        late.acquire()
    assert "taking over the run lock" in caplog.text and "gpu-b" in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == late.token
    # the first driver's heartbeat now finds the lock taken over: it stops refreshing and never removes it
    with caplog.at_level(logging.ERROR, logger="openrlhf_hacpo"):
        assert first.heartbeat() is False
    assert "was taken over" in caplog.text
    first.release()
    assert (tmp_path / LOCK_FILE).exists()
    late.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_heartbeat_thread_refreshes_the_lock(tmp_path):
    clock = _Clock(NOW)
    lock = RunLock(str(tmp_path), clock=clock, heartbeat_s=0.02)
    lock.acquire()
    try:
        clock.now = NOW + 30
        deadline = time.monotonic() + 5
        while json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] != NOW + 30:
            assert time.monotonic() < deadline, "the heartbeat was not refreshed"
            time.sleep(0.01)
        lock.record_processes([5, 3])
        content = json.loads((tmp_path / LOCK_FILE).read_text())
        assert content["processes"] == [3, 5] and content["token"] == lock.token
    finally:
        lock.release()
    assert lock._thread is None and not (tmp_path / LOCK_FILE).exists()
