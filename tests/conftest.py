"""Test-wide settings.

TRITON_INTERPRET must be set before any module decorates a Triton kernel, so it is set here, before
`hacpo_kernels` is imported by any test: without a CUDA device the Triton kernels run in Triton's interpreter
on the CPU and are compared against float64 references like the torch twins.
"""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# DeepSpeed's CPU shared-memory op, prebuilt there by scripts/install.sh (else the first training test builds it)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the ninja of every DeepSpeed op build in the session, the training workers' one (tests that open DeepSpeed
# themselves and the processes they start too): another version would compile the installed op again
from openrlhf_hacpo.utils.op_build import use_interpreter_ninja  # noqa: E402

use_interpreter_ninja()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is reported by the tests themselves
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

# the tiers (unit / integration / e2e) and the guard that keeps unit tests in one process: tests/tier_guard.py
from tier_guard import (pytest_addoption, pytest_collection_modifyitems, pytest_runtest_setup,  # noqa: E402,F401
                        pytest_runtest_teardown)

# the order files reach pytest-xdist's workers, the longest first: tests/schedule.py
pytest_plugins = ["pytester", "schedule"]

TESTDATA = pathlib.Path(__file__).parent / "testdata"


@pytest.fixture(scope="session")
def testdata_dir() -> pathlib.Path:
    return TESTDATA


# --------------------------------------------------------------------------------------------------------------
# Tiny heterogeneous agents, prompt data and a reward file for the runs of tests/trainer and tests/reliability
# (built once per session in a temp folder; no downloads):
# * ``llama``: Llama architecture with the zoo's character tokenizer (``<s>`` + message + ``"\nA: "`` template);
# * ``qwen``: Qwen3 architecture with the zoo's byte-level BPE tokenizer (ChatML template);
# * ``llama2``: a second Llama with other initial weights (three-agent runs).
# The reward file (OpenRLHF style) scores a response by the parity of its length, so random models get mixed
# rewards and non-zero advantages.
# --------------------------------------------------------------------------------------------------------------
REWARD_FILE = '''
def reward_func(queries, prompts, labels):
    """1.0 when the response (query minus prompt) has an even number of characters."""
    return [float((len(q) - len(p)) % 2 == 0) for q, p in zip(queries, prompts)]
'''


def _save_agent(root: pathlib.Path, name: str, family: str, tokenizer_kind: str, seed: int) -> str:
    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    tokenizer = build_tokenizer(tokenizer_kind)
    # head_dim 32: vLLM's CPU attention supports head sizes >= 32
    spec = ModelSpec(family=family, hidden_size=32, num_layers=2, num_heads=2, head_dim=32, num_kv_heads=1,
                     intermediate_size=64, max_position_embeddings=128)
    model = build_model(spec, tokenizer, seed=seed)
    path = root / name
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_agents(tmp_path_factory) -> dict[str, str]:
    """Model folders of the tiny agents, by name."""
    root = tmp_path_factory.mktemp("agents")
    return {
        "llama": _save_agent(root, "llama", "llama", "char", seed=1),
        "qwen": _save_agent(root, "qwen", "qwen3", "bpe", seed=2),
        "llama2": _save_agent(root, "llama2", "llama", "char", seed=3),
    }


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory) -> str:
    """Eight chat-form arithmetic prompts (``input`` / ``label``)."""
    from openrlhf_hacpo.data.arithmetic import Problem, to_record

    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    problems = [Problem(1, (a, b)) for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (6, 3), (4, 4), (8, 0)]]
    path.write_text("".join(json.dumps(to_record(p, f"p{i}")) + "\n" for i, p in enumerate(problems)))
    return str(path)


@pytest.fixture(scope="session")
def reward_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reward") / "parity_reward.py"
    path.write_text(REWARD_FILE)
    return str(path)
