"""The order in which test files reach pytest-xdist's workers: the longest first.

``tests/run.sh`` runs one test file per worker at a time (``--dist loadfile``) and hands the files out in the order
this plugin leaves them (it passes ``--no-loadscope-reorder``; xdist's own reorder puts the files with the most tests
first, which leaves a file holding one long run for last, run by one worker while the others have finished). Here the
files of ``COST_S`` go first, the most expensive first (longest processing time first); every other file keeps its
place after them, in the order collected. Only the order changes: the same tests run, each file in one worker.

``LAST`` files go after every other: files whose processes wait on each other so often that sharing the cores with
another worker's test slows them several times over. ``tests/trainer/test_two_ranks_zero3.py`` (two ZeRO-3 ranks
meeting on gloo for every parameter's gather): its test's call took 38.2 s alone and 208.7 s beside two busy
processes (``pytest -n 0`` of the file, without and with two ``python3 -c "while True: pass"`` running, one after the
other); last, it runs while the other workers finish their last small files or have none.

``COST_S`` holds the heaviest files' seconds: each file's total time (setup, call and teardown of its tests) in the
JUnit report of one two-worker run of the e2e tier (``--dist loadfile``) on a 2-core machine, rounded: a run on a
fresh ``.venv`` and cache, as CI's (SmolLM2 converted, the small mode's qwenS built, vLLM's model information read
for the first time), and ``tests/trainer/test_vllm_backend.py`` from the run after its trim. Refresh it from
the report of ``bash tests/run.sh --tier e2e --junitxml=FILE`` when files grow or shrink; a stale figure costs wall
time only, and ``tests/test_schedule.py`` fails when a listed file no longer exists.
"""
from __future__ import annotations

import pytest

COST_S: dict[str, float] = {
    "tests/multinode/test_two_node_runs.py": 217,
    "tests/reproduce/test_small_pipeline.py": 184,
    "tests/zoo/test_zoo_shipped.py": 151,
    "tests/trainer/test_one_step_off.py": 95,
    "tests/trainer/test_vllm_backend.py": 69,
    "tests/trainer/test_ray_training.py": 64,
    "tests/engines/test_vllm_engine.py": 59,
    "tests/gpu_stack/test_gpu_train_check.py": 59,
    "tests/trainer/test_hf_engine_backend.py": 52,
    "tests/reliability/test_shutdown.py": 50,
    "tests/reproduce/test_real_weights.py": 46,
    "tests/test_tiny_main.py": 43,
    "tests/trainer/test_kernel_backends.py": 42,
    "tests/reliability/test_two_node_failures.py": 35,
    "tests/trainer/test_lora_run.py": 35,
    "tests/benchmarks/test_throughput.py": 34,
    "tests/actors/test_vllm_rollout_chain.py": 29,
    "tests/engines/test_lora_sync.py": 25,
}


LAST: tuple[str, ...] = ("tests/trainer/test_two_ranks_zero3.py",)


def cost_of(item: pytest.Item) -> float:
    """The listed cost of the item's file, 0 for a file not listed."""
    return COST_S.get(item.nodeid.split("::", 1)[0], 0.0)


def place_of(item: pytest.Item) -> tuple[bool, float]:
    """The sort key: files of ``LAST`` after every other, then the most expensive first."""
    return item.nodeid.split("::", 1)[0] in LAST, -cost_of(item)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files of ``COST_S`` first, the most expensive first, and the files of ``LAST`` at the end; a stable sort, so
    tests keep their order within a file and unlisted files keep theirs."""
    items.sort(key=place_of)
