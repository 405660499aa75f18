"""Rollout backends behind one interface (`RolloutEngine`): transformers `generate` (in the policy, or in an `HFEngine`
actor beside it) and vLLM engine actors.

The vLLM names are imported on first use, so `import openrlhf_hacpo.engines` needs neither vLLM nor Ray.
"""
from openrlhf_hacpo.engines.base import (
    GenerationOutput,
    RolloutEngine,
    SamplingConfig,
    cut_at_eos,
    validate_prompts,
)
from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine, resolve_eos_token_ids

_LAZY = {
    "HFEngine": "openrlhf_hacpo.engines.hf_engine",
    "create_hf_engine": "openrlhf_hacpo.engines.hf_engine",
    "VLLMEngine": "openrlhf_hacpo.engines.vllm_engine",
    "VLLMEngineActor": "openrlhf_hacpo.engines.vllm_engine",
    "create_vllm_engines": "openrlhf_hacpo.engines.vllm_engine",
    "push_weights_to_engines": "openrlhf_hacpo.engines.weight_sync",
    "init_engine_weight_sync": "openrlhf_hacpo.engines.weight_sync",
    "broadcast_weights_to_engines": "openrlhf_hacpo.engines.weight_sync",
}

__all__ = [
    "GenerationOutput",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingConfig",
    "cut_at_eos",
    "resolve_eos_token_ids",
    "validate_prompts",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'openrlhf_hacpo.engines' has no attribute {name!r}")
