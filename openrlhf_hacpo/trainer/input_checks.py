"""Checks of the flags against the data, run by the controller before any worker starts.

* :func:`check_prompt_format`: chat-message prompts need ``--apply_chat_template``;
* :func:`check_reward_signature`: a reward file's ``reward_func`` takes ``(queries, prompts, labels)``, a
  registered verifier ``(response_text, label)``;
* :func:`count_long_prompts`: prompts longer than ``--prompt_max_len`` for one agent's rendering (they are
  left-truncated, at rollout and training time alike);
* :func:`planned_steps_message`: the shortfall when ``--max_steps`` asks for more steps than the data gives.

Label presence is checked by :func:`openrlhf_hacpo.data.prompts.load_prompt_dataset` (every record must carry the
label key).
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

from openrlhf_hacpo.rollout.reward_fns import RewardFunction, _load_reward_file, _resolve_target
from openrlhf_hacpo.rollout.views import LearnerViewConfig, render_prompt_text

__all__ = ["check_prompt_format", "check_reward_signature", "count_long_prompts", "drop_long_prompts",
           "planned_steps_message", "prompt_lengths"]


def check_prompt_format(records: Sequence[Any], apply_chat_template: bool, source: str) -> None:
    """Raise ``ValueError`` naming the file and record when chat-message prompts arrive without a chat template."""
    if apply_chat_template:
        return
    for index, record in enumerate(records):
        if not isinstance(record.prompt, str):
            raise ValueError(f"{source}: record {index} (prompt_id {record.prompt_id!r}) is a list of chat messages, "
                             "which only --apply_chat_template can render; add the flag or give text prompts")


def check_reward_signature(fn: RewardFunction) -> None:
    """Raise ``ValueError`` when the reward function cannot be called the way the runner calls it."""
    if fn.path is not None:
        target, args, shape = _load_reward_file(fn.path, fn.function), 3, f"{fn.function}(queries, prompts, labels)"
        owner = f"reward file {fn.path}"
    else:
        target, args, shape = _resolve_target(fn.target, fn.name), 2, "verifier(response_text, label)"
        owner = f"reward {fn.name!r} ({fn.target})"
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # builtins without a signature: checked when first called
    try:
        signature.bind(*([None] * args))
    except TypeError as err:
        raise ValueError(f"{owner}: {getattr(target, '__name__', target)}{signature} cannot be called as {shape} "
                         f"({err})") from None


def prompt_lengths(records: Sequence[Any], tokenizer: Any, view: LearnerViewConfig) -> list[int]:
    """Token count of each prompt as this tokenizer renders it for generation (chat template applied)."""
    if not records:
        return []
    texts = [render_prompt_text(r.prompt, tokenizer, view) for r in records]
    return [len(x) for x in tokenizer(texts, add_special_tokens=not view.apply_chat_template)["input_ids"]]


def count_long_prompts(records: Sequence[Any], tokenizer: Any, view: LearnerViewConfig) -> tuple[int, int]:
    """(prompts longer than ``view.prompt_max_len`` tokens in this tokenizer's rendering, longest length)."""
    if view.prompt_max_len is None or not records:
        return 0, 0
    lengths = prompt_lengths(records, tokenizer, view)
    return sum(n > view.prompt_max_len for n in lengths), max(lengths)


def drop_long_prompts(records: Sequence[Any], tokenizers: dict[str, Any], view: LearnerViewConfig
                      ) -> tuple[list[Any], dict[str, int]]:
    """The records whose rendering fits ``view.prompt_max_len`` tokens for every agent (the official code drops
    longer prompts at load), and how many each agent's tokenizer found too long. A prompt is dropped for all agents
    when one agent's rendering is too long, so that every agent still sees the same prompts."""
    if view.prompt_max_len is None:
        return list(records), {name: 0 for name in tokenizers}
    too_long = [False] * len(records)
    counts = {}
    for name, tokenizer in tokenizers.items():
        over = [n > view.prompt_max_len for n in prompt_lengths(records, tokenizer, view)]
        counts[name] = sum(over)
        too_long = [a or b for a, b in zip(too_long, over)]
    return [r for r, drop in zip(records, too_long) if not drop], counts


def planned_steps_message(max_steps: int | None, batches_per_epoch: int, num_episodes: int, num_prompts: int,
                          rollout_batch_size: int) -> str | None:
    """The warning text when ``max_steps`` exceeds the steps the data gives, else None."""
    available = batches_per_epoch * num_episodes
    if max_steps is None or max_steps <= available:
        return None
    return (f"--max_steps {max_steps} asks for more steps than the data gives: {num_prompts} prompts // "
            f"rollout_batch_size {rollout_batch_size} = {batches_per_epoch} step(s) per episode × num_episodes "
            f"{num_episodes} = {available} step(s); the run stops after {available} (raise --num_episodes to train "
            f"{max_steps} steps)")
