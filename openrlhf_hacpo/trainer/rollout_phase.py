"""Steps 1–2 of a training step for the controller: every agent's rollout of the same prompts, started at once
(:func:`start_rollouts`, sampling seeded by (run seed, step, agent): :func:`rollout_sampling`), then waited for and
every trajectory verified once (:func:`finish_rollouts`) into the step's
:class:`~openrlhf_hacpo.trainer.in_flight.GeneratedBatch`."""
from __future__ import annotations

from typing import Any, Sequence

from openrlhf_hacpo.actors.pending import Pending
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.base import SamplingConfig
from openrlhf_hacpo.rollout import RewardFunctionError
from openrlhf_hacpo.trainer.in_flight import GeneratedBatch
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.utils.timing import PhaseTimer

__all__ = ["finish_rollouts", "rollout_sampling", "start_rollouts"]


def rollout_sampling(cfg: TrainConfig, step: int, agent: str) -> SamplingConfig:
    """Agent ``agent``'s sampling at ``step``: the run's settings, seeded by ``derive_seed(seed, "rollout", step,
    agent)`` (a resumed run samples what an uninterrupted one would have)."""
    rollout = cfg.rollout
    return SamplingConfig(n=rollout.n_samples_per_prompt, temperature=rollout.temperature, top_p=rollout.top_p,
                          top_k=rollout.top_k, max_new_tokens=cfg.prompts.generate_max_len,
                          seed=derive_seed(cfg.train.seed, "rollout", step, agent))


def start_rollouts(cfg: TrainConfig, groups: Sequence[Any], step: int, prompts: Sequence[Any],
                   rendered: Sequence[Any] | None = None) -> list[Pending]:
    """Every agent's rollout of ``prompts`` for ``step``, started (``rendered``: each agent's rendering)."""
    rendered = rendered if rendered is not None else [None] * len(groups)
    return [g.rollout(prompts, rollout_sampling(cfg, step, g.name), step, rendered=r) for g, r in zip(groups, rendered)]


def finish_rollouts(step: int, pendings: Sequence[Pending], reward_runner: Any) -> GeneratedBatch:
    """Wait for the rollouts (the ``rollout_phase``), verify every trajectory once (``reward``)."""
    timer = PhaseTimer()
    with timer.phase("rollout_phase"):
        rollouts = [p.result() for p in pendings]
    batch = GeneratedBatch(step=step, rollouts=rollouts)
    with timer.phase("reward"):
        try:
            reward_runner.score_trajectories(batch.trajectories)
        except RewardFunctionError as err:
            raise RewardFunctionError(f"step {step}: {err}") from err
    batch.phases = dict(timer.seconds)
    return batch
