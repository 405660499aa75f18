"""The configuration fingerprint stored in every joint checkpoint and compared on ``--resume``.

It holds the settings that decide what a step computes: the algorithm with all its capability, advantage and loss
settings, the agents (name, model as given, tokenizer, learning rate, ZeRO stage, precision, data-parallel size),
the seed, the prompt data and its rendering, the sampling settings and the EOS policy, the reward function, the batch
geometry and mini-batch order, and the optimizer schedule (learning-rate schedule, warm-up, gradient clip, weight
decay, episodes), with ``--one_step_off`` the schedule, with ``--rollout_is`` the training-inference correction, and the engines'
precision where it differs from the policy's (``--engine_dtype``).
Settings that only change how long or how visibly a run goes (``max_steps``, save, log and evaluation cadence, output
sinks) are left out, so they may change between a run and its resume.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from openrlhf_hacpo.config import FLAT_NAMES, TrainConfig

__all__ = ["config_fingerprint", "fingerprint_differences"]

_RUN_FIELDS = ("seed", "prompt_data", "input_key", "label_key", "max_samples", "apply_chat_template",
               "prompt_max_len", "generate_max_len", "n_samples_per_prompt", "rollout_batch_size", "temperature",
               "top_p", "top_k", "eos_policy", "reward_fn", "train_batch_size", "micro_train_batch_size",
               "max_epochs", "minibatch_order", "lr_scheduler", "lr_warmup_steps", "min_lr_ratio", "max_norm",
               "l2", "num_episodes")
"""The run-wide settings fingerprinted, by their flat names (``FLAT_NAMES`` says which section holds each)."""
_AGENT_FIELDS = ("pretrain", "tokenizer", "learning_rate", "zero_stage", "bf16", "dp_size")
_LORA_FIELDS = ("lora_rank", "lora_alpha", "lora_dropout", "target_modules")
"""Fingerprinted for agents with ``lora_rank`` > 0 only, so full-parameter fingerprints stay as they were."""
# one_step_off and own_old_logp (its resolved value: auto is stored as what it chose) are fingerprinted for
# --one_step_off runs only: their rows are generated one version stale and their checkpoints hold the next step's
# batch, so a resume must keep the schedule (synchronous fingerprints stay as they were)
_ROLLOUT_IS_PREFIX = "algo.loss.rollout_is"
"""The training-inference correction's settings (``--rollout_is*``) are fingerprinted only when it is on, so the
fingerprints of runs without it stay as they were."""


def config_fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    """Flat ``{setting: value}`` of the settings that must match on resume (plain values, JSON- and pickle-safe).

    The keys name each setting as the flat configuration did (``seed``, ``algo.loss.delta``,
    ``agent.<name>.learning_rate``), whatever section holds it now, so checkpoints written before the sections
    (``tests/testdata/checkpoint_58967b6``) resume without a migration."""
    algo = cfg.algo
    out: dict[str, Any] = {"agents": list(cfg.agent_names), "algo.algorithm": algo.algorithm}
    for section in ("capability", "advantage"):
        out.update({f"algo.{section}.{k}": _plain(v) for k, v in dataclasses.asdict(getattr(algo, section)).items()})
    out.update({f"algo.loss.{k}": _plain(v) for k, v in algo.loss.settings().items()})
    if not algo.loss.params.rollout_is:
        out = {k: v for k, v in out.items() if not k.startswith(_ROLLOUT_IS_PREFIX)}
    for name in _RUN_FIELDS:
        section, field = FLAT_NAMES[name]
        out[name] = _plain(getattr(getattr(cfg, section), field))
    if cfg.train.one_step_off:
        out.update({"one_step_off": True, "own_old_logp": cfg.resolved_own_old_logp})
    for agent in cfg.resolved_agents:
        out.update({f"agent.{agent.name}.{k}": _plain(getattr(agent, k)) for k in _AGENT_FIELDS})
        if agent.resolved_engine_dtype != agent.policy_dtype:  # engines in another precision than the policy
            out[f"agent.{agent.name}.engine_dtype"] = agent.resolved_engine_dtype  # (only then: fingerprints stay)
        if agent.lora_rank:  # a LoRA agent's checkpoint holds its adapter: rank and targets must match on resume
            out.update({f"agent.{agent.name}.{k}": getattr(agent, k) for k in _LORA_FIELDS})
    return out


def fingerprint_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"setting: checkpoint X, this run Y"`` for every setting that differs (missing on one side included)."""
    out = []
    for key in sorted(set(stored) | set(current)):
        old, new = stored.get(key, "<unset>"), current.get(key, "<unset>")
        if old != new:
            out.append(f"{key}: checkpoint {old!r}, this run {new!r}")
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
