"""One local Ray cluster for the tests of a folder, instead of one per test module.

Starting Ray takes about 15 s on 2 CPU cores. A folder's conftest opts in by importing the ``ray_cluster`` fixture
and the ``pytest_runtest_teardown`` hook from here. The first test of the folder that asks for Ray starts it
(:func:`start`); the folder's later tests reuse it, and the hook (:func:`stop_after_folder`) shuts it down after the
folder's last test, so
tests elsewhere that start a cluster of their own (other settings, fake GPUs, several nodes) never find one running.
A module that started and shut down a cluster of its own in between is no trouble: :func:`start` starts one again.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

_started_for: list[Path] = []  # the folder whose tests the running cluster serves (empty: none started here)


def start(folder: Path):
    """The ``ray`` module with a local cluster up: 2 CPUs (actors ask for no CPU, so several agents fit), no dashboard,
    the test settings in every worker's environment. Reuses a cluster already running in this process."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                           "TORCH_EXTENSIONS_DIR": os.environ["TORCH_EXTENSIONS_DIR"],
                                           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0")}})
        _started_for[:] = [Path(folder)]
    return ray


def stop_after_folder(nextitem) -> None:
    """Shut down the cluster :func:`start` started when the next test is not in its folder (or there is none)."""
    if not _started_for:
        return
    if nextitem is None or _started_for[0] not in Path(nextitem.path).parents:
        _started_for.clear()
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(request):
    """The local Ray cluster of the requesting test folder's tests."""
    return start(Path(request.path).parent)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    stop_after_folder(nextitem)
