"""Tiny heterogeneous agents for the arithmetic task: tokenizers, model configs, warm start, cache and presets.

    from openrlhf_hacpo.zoo import agent_folders, load_agent
    paths = agent_folders("model")            # {"llamaS": Path, "qwenM": Path}: the agents shipped with the package
    model, tokenizer = load_agent(paths["qwenM"])
    build_zoo("model")                        # the same recipes built on this machine (cached; may differ)

Command line: ``python -m openrlhf_hacpo.zoo list|verify|build|ship|eval`` (see ``--help``).

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
    REGIMES,
    Regime,
    RLHyperparams,
    get_preset,
    get_regime,
    resolve_agents,
)
from openrlhf_hacpo.zoo.shipped import SHIPPED_DIR, agent_folders, agent_record, verify_folder, weights_fingerprint
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
    "REGIMES",
    "RLHyperparams",
    "Regime",
    "SHIPPED_DIR",
    "WarmStartConfig",
    "WarmStartResult",
    "agent_dir",
    "agent_folders",
    "agent_record",
    "build_agent",
    "build_bpe_tokenizer",
    "build_char_tokenizer",
    "build_model",
    "build_tokenizer",
    "build_zoo",
    "get_regime",
    "default_cache_dir",
    "evaluate_accuracy",
    "generate_responses",
    "get_preset",
    "is_built",
    "load_agent",
    "read_meta",
    "resolve_agents",
    "spec_hash",
    "verify_folder",
    "warm_start",
    "weights_fingerprint",
]
