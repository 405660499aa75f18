"""Fixtures for the engine tests; the builders and references live in engine_fixtures.py."""
from pathlib import Path

import local_ray
import pytest
from engine_fixtures import make_bpe_tokenizer, make_char_tokenizer

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def char_tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return make_bpe_tokenizer()


@pytest.fixture(scope="module")
def ray_cluster():
    """The local Ray cluster of this folder's tests (tests/local_ray.py): started by the first module that asks for
    it, shut down after the folder's last test."""
    return local_ray.start(HERE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    local_ray.stop_after_folder(nextitem)
