"""Fixtures for the engine tests; the builders and references live in engine_fixtures.py."""
import pytest
from engine_fixtures import make_bpe_tokenizer, make_char_tokenizer
from local_ray import pytest_runtest_teardown, ray_cluster  # noqa: F401  (the folder's one Ray cluster)


@pytest.fixture(scope="module")
def char_tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return make_bpe_tokenizer()
