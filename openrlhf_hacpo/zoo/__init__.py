"""Tiny heterogeneous agents for the arithmetic task: tokenizers, model configs, warm start, cache and presets.

    from openrlhf_hacpo.zoo import build_zoo, load_agent
    paths = build_zoo("model")                # {"llamaS": Path, "qwenM": Path}, built once then cached
    model, tokenizer = load_agent(paths["qwenM"])

Command line: ``python -m openrlhf_hacpo.zoo build --preset model`` (see ``--help``).

The main job that trains a preset's agents together (``python -m openrlhf_hacpo.cli.tiny run``) is
:mod:`openrlhf_hacpo.zoo.job`; its summary, table, plot and statistics over seeds are :mod:`openrlhf_hacpo.zoo.reports`
(imported on their own, not from this package).
"""
from openrlhf_hacpo.zoo.cache import (
    agent_dir,
    build_agent,
    build_zoo,
    default_cache_dir,
    is_built,
    load_agent,
    read_meta,
    spec_hash,
)
from openrlhf_hacpo.zoo.evaluate import EvalResult, evaluate_accuracy, generate_responses
from openrlhf_hacpo.zoo.models import ModelSpec, build_model
from openrlhf_hacpo.zoo.presets import (
    AGENTS,
    DEFAULT_PRESET,
    PRESETS,
    AgentSpec,
    Preset,
    RLHyperparams,
    get_preset,
    resolve_agents,
)
from openrlhf_hacpo.zoo.tokenizers import build_bpe_tokenizer, build_char_tokenizer, build_tokenizer
from openrlhf_hacpo.zoo.warmstart import WarmStartConfig, WarmStartResult, warm_start

__all__ = [
    "AGENTS",
    "DEFAULT_PRESET",
    "PRESETS",
    "AgentSpec",
    "EvalResult",
    "ModelSpec",
    "Preset",
    "RLHyperparams",
    "WarmStartConfig",
    "WarmStartResult",
    "agent_dir",
    "build_agent",
    "build_bpe_tokenizer",
    "build_char_tokenizer",
    "build_model",
    "build_tokenizer",
    "build_zoo",
    "default_cache_dir",
    "evaluate_accuracy",
    "generate_responses",
    "get_preset",
    "is_built",
    "load_agent",
    "read_meta",
    "resolve_agents",
    "spec_hash",
    "warm_start",
]
