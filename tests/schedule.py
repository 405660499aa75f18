"""The order in which test files reach pytest-xdist's workers: the longest first.

``tests/run.sh`` runs one test file per worker at a time (``--dist loadfile``) and hands the files out in the order
this plugin leaves them (it passes ``--no-loadscope-reorder``; xdist's own reorder puts the files with the most tests
first, which leaves a file holding one long run for last, run by one worker while the others have finished). Here the
files of ``COST_S`` go first, the most expensive first (longest processing time first); every other file keeps its
place after them, in the order collected. Only the order changes: the same tests run, each file in one worker.

``COST_S`` holds the heaviest files' seconds: the sum of their tests' setup, call and teardown times of at least 6 s in
one two-worker run of the e2e tier (``--dist loadfile``, ``--durations=40``) on a 2-core machine, rounded. Refresh it
from the report of ``bash tests/run.sh --tier e2e --durations=40`` when files grow; a stale figure costs wall time
only, and ``tests/test_schedule.py`` fails when a listed file no longer exists.
"""
from __future__ import annotations

import pytest

COST_S: dict[str, float] = {
    "tests/trainer/test_vllm_backend.py": 196,
    "tests/multinode/test_two_node_runs.py": 169,
    "tests/trainer/test_old_logp_from_update.py": 96,
    "tests/trainer/test_one_step_off.py": 126,
    "tests/reproduce/test_small_pipeline.py": 117,
    "tests/zoo/test_zoo_shipped.py": 96,
    "tests/trainer/test_two_ranks_zero3.py": 60,
    "tests/trainer/test_row_skipping_deepspeed.py": 30,
    "tests/reproduce/test_real_weights.py": 79,
    "tests/engines/test_vllm_engine.py": 65,
    "tests/trainer/test_ray_training.py": 62,
    "tests/reliability/test_shutdown.py": 61,
    "tests/trainer/test_lora_run.py": 55,
    "tests/gpu_stack/test_gpu_train_check.py": 49,
    "tests/engines/test_lora_sync.py": 47,
    "tests/trainer/test_kernel_backends.py": 42,
    "tests/trainer/test_hf_engine_backend.py": 35,
}


def cost_of(item: pytest.Item) -> float:
    """The listed cost of the item's file, 0 for a file not listed."""
    return COST_S.get(item.nodeid.split("::", 1)[0], 0.0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files of ``COST_S`` first, the most expensive first; a stable sort, so tests keep their order within a file
    and unlisted files keep theirs."""
    items.sort(key=lambda item: -cost_of(item))
