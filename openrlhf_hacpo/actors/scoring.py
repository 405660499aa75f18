"""From sampled responses to trajectories: prompt rendering and the old-log-prob recompute of own responses.

The ratio denominator of the policy loss is the policy's own recompute at the rollout temperature, not the engine's
log-probs (docs/training.md, "One step"). Each prompt is rendered once per call, as ids (what the model generates
from, left-truncated to ``prompt_max_len``) and as text (what reward functions read).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from openrlhf_hacpo.algorithms.mismatch import row_summaries_ragged
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.models import score_logprobs
from openrlhf_hacpo.rollout import LearnerViewConfig, Trajectory, make_trajectory, render_prompt_ids, render_prompt_text
from openrlhf_hacpo.rollout.views import encode_prompt_text
from openrlhf_hacpo.utils.padding import micro_batch_groups, packed_positions
from openrlhf_hacpo.utils.timing import PhaseTimer

__all__ = ["RenderedPrompts", "RolloutScorer", "mismatch_rows", "mismatch_sampling", "view_config"]


def view_config(cfg: TrainConfig) -> LearnerViewConfig:
    """How trajectories become token rows for a learner (prompt rendering, EOS policy, truncation)."""
    return LearnerViewConfig(
        eos_policy=cfg.rollout.eos_policy,
        prompt_max_len=cfg.prompts.prompt_max_len,
        generate_max_len=cfg.prompts.generate_max_len,
        apply_chat_template=cfg.prompts.apply_chat_template,
        enable_thinking=cfg.prompts.enable_thinking if cfg.prompts.apply_chat_template else None,
        own_old_logp_from_engine=cfg.resolved_own_old_logp == "behaviour",
    )


def mismatch_sampling(cfg: TrainConfig, sampling: SamplingConfig) -> SamplingConfig:
    """``sampling`` asking the engine for its log-probs of the sampled tokens where the mismatch metrics compare
    them with the scoring pass (``--mismatch_metrics`` at ``--temperature 1``: the engines' log-probs are
    temperature-1 ones, the recompute is at the rollout temperature). Same tokens either way: the engines record
    the log-probs beside sampling without drawing from the random stream."""
    if cfg.engines.mismatch_metrics and cfg.rollout.temperature == 1.0 and not cfg.compute.old_logp_from_update:
        return replace(sampling, return_logprobs=True)
    return sampling


def mismatch_rows(outputs: Sequence[GenerationOutput], trajectories: Sequence[Trajectory]) -> tuple:
    """Per own row, the summary of its engine log-probs (``GenerationOutput.logprobs``) against the scoring pass's
    (``Trajectory.source_logp``) over every sampled token
    (:func:`~openrlhf_hacpo.algorithms.mismatch.row_summaries`); ``()`` unless every row has both. Read only for
    metrics: nothing here reaches the loss."""
    if not outputs or any(o.logprobs is None for o in outputs) or any(not len(t.source_logp) for t in trajectories):
        return ()
    rows = row_summaries_ragged([t.source_logp for t in trajectories], [list(o.logprobs) for o in outputs])
    return tuple(tuple(float(x) for x in row) for row in rows.tolist())


@dataclass(frozen=True)
class RenderedPrompts:
    """One agent's rendering of a prompt batch: ``ids[i]`` (left-truncated) and ``texts[i]`` of prompt i."""

    ids: list[list[int]]
    texts: list[str]

    def select(self, indices: Sequence[int]) -> "RenderedPrompts":
        return RenderedPrompts(ids=[self.ids[i] for i in indices], texts=[self.texts[i] for i in indices])


class RolloutScorer:
    """Renders prompts with one agent's tokenizer and turns its sampled responses into trajectories.

    Args:
        cfg: the run configuration.
        agent_index: the agent whose responses these are (the trajectories' ``source``).
        tokenizer: the agent's tokenizer (chat template applied).
        eos_token_ids: the ids that end a response.
    """

    def __init__(self, cfg: TrainConfig, agent_index: int, tokenizer: Any, eos_token_ids: Sequence[int]) -> None:
        self.cfg = cfg
        self.agent_index = agent_index
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.view_cfg = view_config(cfg)

    def prompt_ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids for generation: the agent's own rendering, left-truncated to ``prompt_max_len``."""
        return [render_prompt_ids(r.prompt, self.tokenizer, self.view_cfg)[-self.cfg.prompts.prompt_max_len:]
                for r in prompts]

    def prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """The prompts as this agent's model reads them (chat template applied), e.g. for reward files."""
        return [render_prompt_text(r.prompt, self.tokenizer, self.view_cfg) for r in prompts]

    def render(self, prompts: Sequence[Any]) -> RenderedPrompts:
        """Each prompt's text (chat template applied once) and its ids for generation (left-truncated)."""
        texts = self.prompt_texts(prompts)
        ids = [encode_prompt_text(t, self.tokenizer, self.view_cfg)[-self.cfg.prompts.prompt_max_len:] for t in texts]
        return RenderedPrompts(ids=ids, texts=texts)

    def scoring_positions(self, rendered: RenderedPrompts, outputs: Sequence[GenerationOutput]) -> tuple[int, int]:
        """(token positions, real tokens) that :meth:`trajectories`' scoring pass computes: its micro-batches are
        those of :func:`~openrlhf_hacpo.models.score_logprobs` (same rows, size and grouping); (0, 0) when the
        learner scores its own rows (``old_logp_from_update``)."""
        if self.cfg.compute.old_logp_from_update:
            return 0, 0
        prompt_lengths = [len(rendered.ids[o.prompt_index]) for o in outputs]
        response_lengths = [len(o.response_token_ids) for o in outputs]
        groups = micro_batch_groups(prompt_lengths, response_lengths, self.cfg.train.micro_train_batch_size,
                                    self.cfg.compute.length_grouping)
        return packed_positions(prompt_lengths, response_lengths, groups)

    def trajectories(self, model: Any, prompts: Sequence[Any], rendered: RenderedPrompts,
                     outputs: Sequence[GenerationOutput], step: int, device: Any,
                     timer: PhaseTimer) -> list[Trajectory]:
        """Score ``outputs`` (own responses to ``prompts``) with ``model`` in eval mode and return the trajectories;
        the seconds this takes go to ``timer``'s ``scoring`` phase. With ``old_logp_from_update`` nothing is scored
        here: the trajectories leave unscored and the agent's learner records their old log-probs at its first
        update (:meth:`~openrlhf_hacpo.rollout.Trajectory.set_old_logps`)."""
        cfg = self.cfg
        with timer.phase("scoring"):
            logps: list = [None] * len(outputs)
            if not cfg.compute.old_logp_from_update:
                logps = self.score(model, [rendered.ids[o.prompt_index] for o in outputs],
                                   [list(o.response_token_ids) for o in outputs], device)
            trajs = []
            for out, logp in zip(outputs, logps):
                record = prompts[out.prompt_index]
                trajs.append(make_trajectory(
                    prompt_id=record.prompt_id, prompt=record.prompt, label=record.label, source=self.agent_index,
                    step=step, token_ids=out.response_token_ids, token_logps=logp,  # kept as the float32 tensor
                    eos_token_id=self.eos_token_ids,
                    eos_policy=cfg.rollout.eos_policy, tokenizer=self.tokenizer, finish_reason=out.finish_reason,
                    metadata={"prompt_text": rendered.texts[out.prompt_index], "sample_index": out.sample_index},
                ))
        return trajs

    def score(self, model: Any, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
              device: Any) -> list[Any]:
        """Per-token log-probs (float32 CPU tensors) of each response under ``model`` in eval mode, at the rollout
        temperature, in micro-batches of the update's size."""
        cfg = self.cfg
        model.eval()
        try:
            return score_logprobs(model, prompt_ids, response_ids, int(self.tokenizer.pad_token_id),
                                  cfg.rollout.temperature, cfg.train.micro_train_batch_size, device,
                                  path=cfg.compute.logprob_path, backend=cfg.compute.kernel_backend,
                                  group_by_length=cfg.compute.length_grouping)
        finally:
            model.train()
