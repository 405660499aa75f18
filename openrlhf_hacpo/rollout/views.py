"""Learner views: every stored trajectory as token rows for one learner's tokenizer.

Paper-vs-code choices made here are items 7–10 of the table in docs/algorithm.md §5.

For learner k and a trajectory from source j:

* **own rows** (j == k) keep the source's original action ids (as the official v1 code) and their per-token old
  log-probs;
* **foreign rows** (j != k) re-render the prompt with the learner's chat template (both official codes) and
  re-tokenize the response *text* with the learner's tokenizer: ``tokenizer(text, add_special_tokens=False)``.

Both carry the source-normalised old log-prob ``old_logp_mean = source_logp_sum / source_num_tokens``, the
denominator of the cross-agent ratio (eq. 11 with each side normalised by its own token count); NaN for a trajectory
not scored yet (``old_logp_from_update``: the learner fills it in before the values are used). An own row of a
trajectory that carries the sampling engine's log-probs (``Trajectory.behaviour_logp``) takes those as its per-token
old log-probs and their mean over the L_j action tokens as its ``old_logp_mean`` when ``own_old_logp_from_engine``
(``--own_old_logp behaviour``); foreign rows keep the scoring pass's mean.

The engine's log-probs also travel separately from the old ones, for the training-inference correction
(``--rollout_is``): every row of such a trajectory carries ``engine_logp_mean``, the source engine's mean log-prob
over the source's own L_j action tokens (a mean, like ``old_logp_mean``), and an own row ``engine_logp``, the
per-token values on its (the source's) tokens, cut like ``old_logp``. A foreign row has no per-token engine values:
its tokens are the learner's, not the ones the engine scored.

EOS (the paper is silent; the official codes differ): with ``eos_policy="drop"`` no row contains a terminal EOS
action (an EOS-only response stays a single EOS action); with ``"keep"`` own rows keep the generated EOS and foreign
rows that finished get the *learner's* EOS id appended; with ``"text"`` (the official main code) own rows keep the
generated EOS and foreign rows are the learner's tokens of the source's text decoded with its special tokens, the
source's EOS string included.

Overflow: prompts are left-truncated to ``prompt_max_len`` and responses right-truncated to ``generate_max_len``;
``old_logp_mean`` still covers the full source response, as in both official codebases.

Prompt rendering (:func:`render_prompt_ids`) follows transformers' own ``apply_chat_template(tokenize=True)``: the
template text is encoded with ``add_special_tokens=False``, so a template that writes ``bos_token`` yields exactly one
BOS and a template that does not yields none. Rollout engines use the same function, so an agent's own rows see the
prompt ids it generated from.

The rows come back as a :class:`~openrlhf_hacpo.rollout.learner_batch.LearnerBatch`, which splits them into the
updates' mini-batches and packs them for the loss (:mod:`openrlhf_hacpo.rollout.learner_batch`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from openrlhf_hacpo.rollout.learner_batch import LearnerBatch, LearnerRow
from openrlhf_hacpo.rollout.trajectory import EOS_POLICIES, Prompt, Trajectory

__all__ = [
    "LearnerViewConfig",
    "build_learner_batch",
    "encode_prompt_text",
    "encode_response",
    "render_prompt_ids",
    "render_prompt_text",
]


@dataclass(frozen=True)
class LearnerViewConfig:
    """How trajectories become a learner's token rows.

    Args:
        eos_policy: ``"drop"`` (official v1 code), ``"keep"`` or ``"text"`` (official main code); must match the
            policy the trajectories were created with.
        prompt_max_len: prompts longer than this keep their last ``prompt_max_len`` tokens; None = no limit.
        generate_max_len: responses longer than this keep their first ``generate_max_len`` tokens; None = no limit.
        apply_chat_template: render prompts with the tokenizer's chat template (a raw string prompt becomes one user
            message); False encodes a raw string prompt directly, with the tokenizer's special tokens (e.g. BOS).
        enable_thinking: passed to the chat template (Qwen3 templates read it); None passes nothing.
        own_old_logp_from_engine: own rows of trajectories that carry the sampling engine's log-probs take them as
            their old log-probs (``--own_old_logp behaviour``); False keeps the scoring pass's, and the engine's
            values only reach the rows' ``engine_logp`` / ``engine_logp_mean`` (the training-inference correction).
    """

    eos_policy: str = "drop"
    prompt_max_len: int | None = 1024
    generate_max_len: int | None = 4096
    apply_chat_template: bool = True
    enable_thinking: bool | None = False
    own_old_logp_from_engine: bool = True

    def __post_init__(self) -> None:
        if self.eos_policy not in EOS_POLICIES:
            raise ValueError(f"LearnerViewConfig.eos_policy must be one of {EOS_POLICIES}, got {self.eos_policy!r}")
        for name in ("prompt_max_len", "generate_max_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"LearnerViewConfig.{name} must be a positive int or None, got {value!r}")


# ------------------------------------------------------------------------------------------------------ tokenizing
def _input_ids(encoding: Any) -> list[int]:
    ids = encoding["input_ids"] if not isinstance(encoding, list) else encoding
    return [int(i) for i in ids]


def _tokenizer_name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def render_prompt_text(prompt: Prompt, tokenizer: Any, cfg: LearnerViewConfig) -> str:
    """The prompt as the model sees it: the chat template with the generation prompt, or the raw text."""
    if not cfg.apply_chat_template:
        if not isinstance(prompt, str):
            raise ValueError("a chat-message prompt needs apply_chat_template=True")
        return prompt
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"tokenizer {_tokenizer_name(tokenizer)!r} has no chat template (apply_chat_template=True)")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    kwargs = {} if cfg.enable_thinking is None else {"enable_thinking": cfg.enable_thinking}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def render_prompt_ids(prompt: Prompt, tokenizer: Any, cfg: LearnerViewConfig) -> list[int]:
    """Prompt token ids for ``tokenizer`` (untruncated).

    Chat-template text is encoded with ``add_special_tokens=False`` (the template owns BOS); a raw-text prompt
    without a template is encoded with the tokenizer's special tokens, as ``tokenizer(text)`` would.
    """
    return encode_prompt_text(render_prompt_text(prompt, tokenizer, cfg), tokenizer, cfg)


def encode_prompt_text(text: str, tokenizer: Any, cfg: LearnerViewConfig) -> list[int]:
    """Token ids of a prompt already rendered by :func:`render_prompt_text` (see :func:`render_prompt_ids`)."""
    return _input_ids(tokenizer(text, add_special_tokens=not cfg.apply_chat_template))


def encode_response(text: str, tokenizer: Any) -> list[int]:
    """Response text to the learner's ids, without special tokens: ``tokenizer(text, add_special_tokens=False)``."""
    return _input_ids(tokenizer(text, add_special_tokens=False))


def _encode_responses(texts: list[str], tokenizer: Any) -> list[list[int]]:
    """:func:`encode_response` for many texts in one tokenizer call (fast tokenizers encode a batch in parallel)."""
    if not texts:
        return []
    return [[int(i) for i in ids] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


# ------------------------------------------------------------------------------------------------------ rows
def _truncate(prompt_ids: list[int], response_ids: list[int], old_logp: Any, cfg: LearnerViewConfig):
    prompt_truncated = cfg.prompt_max_len is not None and len(prompt_ids) > cfg.prompt_max_len
    if prompt_truncated:
        prompt_ids = prompt_ids[-cfg.prompt_max_len :]
    response_truncated = cfg.generate_max_len is not None and len(response_ids) > cfg.generate_max_len
    if response_truncated:
        response_ids = response_ids[: cfg.generate_max_len]
        if old_logp is not None:
            old_logp = old_logp[: cfg.generate_max_len]
    return prompt_ids, response_ids, old_logp, prompt_truncated, response_truncated


def build_learner_batch(
    trajs: Sequence[Trajectory],
    learner: int,
    tokenizer: Any,
    cfg: LearnerViewConfig | None = None,
    eos_token_id: int | None = None,
) -> "LearnerBatch":
    """Turn verified trajectories into learner ``learner``'s rows, in the given order.

    Args:
        trajs: verified trajectories (own and foreign) of one step.
        learner: the learner's agent index; rows with ``source == learner`` are own rows.
        tokenizer: the learner's Hugging Face tokenizer (chat template included).
        cfg: view settings; defaults to :class:`LearnerViewConfig()`.
        eos_token_id: the learner's EOS id for foreign rows (``"keep"`` policy, empty responses); defaults to
            ``tokenizer.eos_token_id``.
    """
    cfg = cfg or LearnerViewConfig()
    trajs = list(trajs)
    learner_eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    prompt_cache: dict[str, tuple[Prompt, list[int]]] = {}
    foreign_ids = iter(_encode_responses([t.text_for_others for t in trajs if t.source != learner], tokenizer))
    rows = []
    for traj in trajs:
        where = f"trajectory {traj.prompt_id!r} from agent {traj.source}"
        if traj.reward is None:
            raise ValueError(f"{where} is not verified (reward is None)")
        if traj.eos_policy != cfg.eos_policy:
            raise ValueError(
                f"{where} was created with eos_policy={traj.eos_policy!r} but the learner view uses "
                f"eos_policy={cfg.eos_policy!r}"
            )
        cached = prompt_cache.get(traj.prompt_id)
        if cached is None:
            cached = (traj.prompt, render_prompt_ids(traj.prompt, tokenizer, cfg))
            prompt_cache[traj.prompt_id] = cached
        elif cached[0] != traj.prompt:
            raise ValueError(f"prompt_id {traj.prompt_id!r} is shared by two different prompts")
        is_own = traj.source == learner
        old_mean = traj.old_logp_mean if traj.source_logp_sum is not None else math.nan
        engine_logp, engine_mean = None, math.nan
        if len(traj.behaviour_logp):  # the sampling engine's values, over the source's L_j action tokens
            engine_logp = traj.action_behaviour_logp()
            engine_mean = math.fsum(engine_logp.tolist()) / traj.source_num_tokens
        if is_own:
            response_ids = traj.action_token_ids()
            old_logp = traj.action_logp()  # the scorer's float32 values, not copied
            if engine_logp is not None and cfg.own_old_logp_from_engine:  # --own_old_logp behaviour
                old_logp, old_mean = engine_logp, engine_mean
            if not len(old_logp):
                old_logp = None
        else:
            response_ids = next(foreign_ids)
            old_logp = engine_logp = None
            if (cfg.eos_policy == "keep" and traj.finished) or not response_ids:
                # A finished response ends with the learner's EOS ("keep"; under "text" the source's EOS string is
                # already in the text); an empty text is the EOS-only response, which stays a single EOS action.
                if learner_eos is None:
                    raise ValueError(f"learner tokenizer {_tokenizer_name(tokenizer)!r} has no eos_token_id")
                response_ids = response_ids + [int(learner_eos)]
        prompt_ids, response_ids, old_logp, p_trunc, r_trunc = _truncate(list(cached[1]), response_ids, old_logp, cfg)
        if engine_logp is not None:
            engine_logp = engine_logp[:len(response_ids)]
        rows.append(
            LearnerRow(
                prompt_id=traj.prompt_id,
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                is_own=is_own,
                source=traj.source,
                reward=float(traj.reward),
                old_logp_mean=old_mean,
                old_logp=old_logp,
                prompt_truncated=p_trunc,
                response_truncated=r_trunc,
                source_num_tokens=int(traj.source_num_tokens),
                engine_logp_mean=engine_mean,
                engine_logp=engine_logp,
            )
        )
    return LearnerBatch(learner=learner, rows=rows)
