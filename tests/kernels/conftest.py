"""Kernel-test settings: report the input seed, reseed torch for every test."""
import zlib

import pytest
import torch

from kernel_checks import DEVICES, SEED


def pytest_report_header(config):
    return f"kernel tests: seed {SEED} (KERNEL_TEST_SEED), devices {DEVICES}"


@pytest.fixture(autouse=True)
def _seed_torch(request):
    torch.manual_seed(SEED * 100_000 + zlib.crc32(request.node.nodeid.encode()) % 100_000)
    yield
