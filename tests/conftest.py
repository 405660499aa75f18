"""Test-wide settings.

TRITON_INTERPRET must be set before any module decorates a Triton kernel, so it is set here, before
`hacpo_kernels` is imported by any test: without a CUDA device the Triton kernels run in Triton's interpreter
on the CPU and are compared against float64 references like the torch twins.
"""
import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is reported by the tests themselves
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pathlib  # noqa: E402

import pytest  # noqa: E402

TESTDATA = pathlib.Path(__file__).parent / "testdata"


@pytest.fixture(scope="session")
def testdata_dir() -> pathlib.Path:
    return TESTDATA
