"""The run's inputs, checked before any worker starts: tokenizers, chat templates, model configs and folders
(:mod:`~openrlhf_hacpo.trainer.model_folder`), data, reward.

Every error names the agent or file at fault. :func:`check_run_inputs` returns the training prompts' loader and the
evaluation records (``None`` without ``--eval_data``).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, Sequence

from openrlhf_hacpo.actors.scoring import view_config
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.data.prompts import PromptDataLoader, load_prompt_dataset
from openrlhf_hacpo.models.tokenizer import load_tokenizer, looks_like_local_path
from openrlhf_hacpo.rollout import get_reward_fn
from openrlhf_hacpo.trainer.evaluation import load_eval_records
from openrlhf_hacpo.trainer.model_folder import check_model_folder
from openrlhf_hacpo.trainer.input_checks import (
    check_prompt_format,
    check_reward_signature,
    count_long_prompts,
    drop_long_prompts,
    planned_steps_message,
)

__all__ = ["agent_tokenizer", "check_run_inputs"]

logger = logging.getLogger(__name__)


def agent_tokenizer(agent: AgentConfig):
    """The agent's tokenizer (chat template override applied); errors name the agent and the path."""
    return load_tokenizer(agent.tokenizer_path, agent.chat_template, owner=f"agent {agent.name!r}")


def check_run_inputs(cfg: TrainConfig) -> tuple[PromptDataLoader, list[Any] | None]:
    """Check every input of the run; returns (training prompt loader, evaluation records or ``None``)."""
    from transformers import AutoConfig

    for agent in cfg.resolved_agents:
        tokenizer = agent_tokenizer(agent)
        if cfg.prompts.apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"agent {agent.name!r}: tokenizer {agent.tokenizer_path!r} has no chat template but "
                "--apply_chat_template is set (give the agent a chat_template=... or drop the flag)")
        if looks_like_local_path(agent.pretrain) and not os.path.exists(agent.pretrain):
            raise FileNotFoundError(f"agent {agent.name!r}: model path {agent.pretrain!r} does not exist")
        try:
            model_config = AutoConfig.from_pretrained(agent.pretrain)
        except Exception as err:  # OSError, ValueError, or a config field of the wrong type (huggingface_hub's)
            raise FileNotFoundError(f"agent {agent.name!r}: cannot load the model from {agent.pretrain!r}: "
                                    f"{type(err).__name__}: {err}") from err
        if os.path.isdir(agent.pretrain):  # weights' shapes and the tokenizer's size, from headers only
            check_model_folder(agent.pretrain, model_config, tokenizer, f"agent {agent.name!r}")
        if cfg.rollout.rollout_backend == "vllm" and not os.path.isdir(agent.pretrain):
            raise FileNotFoundError(f"agent {agent.name!r}: the vllm backend needs a local model folder, "
                                    f"{agent.pretrain!r} is not one")
    check_reward_signature(get_reward_fn(cfg.rewards.reward_fn))
    if cfg.logging.use_wandb and importlib.util.find_spec("wandb") is None:
        raise ImportError("--use_wandb needs the wandb package: pip install 'openrlhf-hacpo[wandb]'")
    prompts = cfg.prompts
    records = load_prompt_dataset(prompts.prompt_data, prompts.input_key, prompts.label_key, prompts.prompt_split,
                                  prompts.max_samples)
    if len(records) < cfg.rollout.rollout_batch_size:
        raise ValueError(f"prompt dataset {cfg.prompts.prompt_data} has {len(records)} prompts, fewer than "
                         f"rollout_batch_size={cfg.rollout.rollout_batch_size}")
    check_prompt_format(records, cfg.prompts.apply_chat_template, cfg.prompts.prompt_data)
    if cfg.prompts.drop_long_prompts:
        records = _drop_long_prompts(cfg, records)
    dataloader = PromptDataLoader(records, cfg.rollout.rollout_batch_size, seed=cfg.train.seed, shuffle=True,
                                  drop_last=True)
    _report_data_shortfalls(cfg, records, len(dataloader))
    eval_records = None
    if cfg.eval.eval_data:
        eval_records = load_eval_records(cfg.eval.eval_data, prompts.input_key, prompts.label_key,
                                         cfg.eval.eval_split, cfg.eval.eval_max_samples)
        check_prompt_format(eval_records, cfg.prompts.apply_chat_template, cfg.eval.eval_data)
        for agent in cfg.resolved_agents:
            if (cfg.rollout.rollout_backend == "hf" and agent.zero_stage == 3 and agent.dp_size > 1
                    and len(eval_records) % agent.dp_size):
                raise ValueError(
                    f"agent {agent.name!r}: with zero_stage=3 its {agent.dp_size} workers generate in lockstep, "
                    f"so the {len(eval_records)} evaluation prompts of {cfg.eval.eval_data} must divide evenly "
                    "(set --eval_max_samples)")
    return dataloader, eval_records


def _drop_long_prompts(cfg: TrainConfig, records: Sequence[Any]) -> list[Any]:
    """``--drop_long_prompts``: keep the prompts every agent renders within ``--prompt_max_len`` tokens."""
    tokenizers = {agent.name: agent_tokenizer(agent) for agent in cfg.resolved_agents}
    kept, counts = drop_long_prompts(records, tokenizers, view_config(cfg))
    logger.warning("--drop_long_prompts: %d of %d prompts dropped (longer than %d tokens for: %s)",
                   len(records) - len(kept), len(records), cfg.prompts.prompt_max_len,
                   ", ".join(f"{name} {n}" for name, n in counts.items()))
    if len(kept) < cfg.rollout.rollout_batch_size:
        raise ValueError(f"prompt dataset {cfg.prompts.prompt_data}: {len(kept)} prompts fit --prompt_max_len "
                         f"{cfg.prompts.prompt_max_len}, fewer than rollout_batch_size="
                         f"{cfg.rollout.rollout_batch_size}")
    return kept


def _report_data_shortfalls(cfg: TrainConfig, records: Sequence[Any], num_batches: int) -> None:
    """Warn, before any worker starts, about steps the data cannot give and prompts that will be truncated."""
    message = planned_steps_message(cfg.train.max_steps, num_batches, cfg.train.num_episodes, len(records),
                                    cfg.rollout.rollout_batch_size)
    if message:
        logger.warning(message)
    view = view_config(cfg)
    for agent in cfg.resolved_agents:
        count, longest = count_long_prompts(records, agent_tokenizer(agent), view)
        if count:
            logger.warning("agent %r: %d of %d prompts are longer than --prompt_max_len %d tokens (longest %d); "
                           "they keep their last %d tokens at rollout and training time alike", agent.name, count,
                           len(records), cfg.prompts.prompt_max_len, longest, cfg.prompts.prompt_max_len)
        else:
            logger.info("agent %r: no prompt is longer than --prompt_max_len %d tokens (longest %d)", agent.name,
                        cfg.prompts.prompt_max_len, longest)
