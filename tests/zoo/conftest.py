"""A tiny zoo built once per test session (20 warm-start steps per agent) in a temporary folder."""
import pytest

from openrlhf_hacpo.zoo import AGENTS, WarmStartConfig, build_zoo

TINY_STEPS = 20


def tiny_spec(name: str, steps: int = TINY_STEPS):
    spec = AGENTS[name]
    return spec.replace(warm_start=WarmStartConfig(lr=spec.warm_start.lr, steps=steps, log_every=5))


@pytest.fixture(scope="session")
def make_tiny_spec():
    """``make_tiny_spec(name, steps=20)``: a named agent with a fixed, short warm start."""
    return tiny_spec


@pytest.fixture(scope="session")
def tiny_specs():
    return [tiny_spec("llamaS"), tiny_spec("qwenM")]


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory, tiny_specs):
    cache = tmp_path_factory.mktemp("zoo")
    return cache, build_zoo(tiny_specs, cache, progress=False)
