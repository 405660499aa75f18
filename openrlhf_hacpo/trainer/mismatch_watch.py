"""Training–inference mismatch per agent and step: the ``mismatch/*`` metrics and the alarm that names a broken
weight sync.

Each agent's rollout brings, per own row, a summary of the engine's log-probs of the sampled tokens against the
scoring pass's recompute (:attr:`~openrlhf_hacpo.actors.results.RolloutResult.mismatch_rows`; the figures and their
formulas: :mod:`openrlhf_hacpo.algorithms.mismatch`). :func:`mismatch_metrics` gives every agent's record
``mismatch/<figure>`` of its own rows and, for a learner that trains on every agent's rows (``hacpo``, ``naive``),
each other source's same figures as ``mismatch/source/<agent>/<figure>`` (the source's own, not recomputed).

:func:`check_mismatch` stops the run (:class:`~openrlhf_hacpo.trainer.failures.TrainingError`) when an agent's own
``mean_abs`` exceeds its threshold (:func:`alarm_threshold`): its engines sample from other weights than its learner
scores with. It runs on each step's rollouts before any update on them, so the step after a broken sync stops. In a
``--one_step_off`` run the engines sample one version behind the scoring pass by design, so the alarm is off there.
"""
from __future__ import annotations

from typing import Any, Sequence

from openrlhf_hacpo.algorithms.mismatch import summarize
from openrlhf_hacpo.config import MISMATCH_ALARM
from openrlhf_hacpo.trainer.failures import TrainingError

__all__ = ["alarm_threshold", "check_mismatch", "mismatch_metrics"]


def _figures(rollouts: Sequence[Any]) -> list[dict[str, float]]:
    return [summarize(r.mismatch_rows) if r.mismatch_rows else {} for r in rollouts]


def mismatch_metrics(rollouts: Sequence[Any], names: Sequence[str], trains_on_foreign: bool) -> list[dict[str, float]]:
    """Per agent, the ``mismatch/*`` entries of its step record (empty where its engines gave no log-probs)."""
    figures = _figures(rollouts)
    out = []
    for k in range(len(names)):
        rec = {f"mismatch/{key}": value for key, value in figures[k].items()}
        if trains_on_foreign:
            for j, name in enumerate(names):
                if j != k:
                    rec.update({f"mismatch/source/{name}/{key}": value for key, value in figures[j].items()})
        out.append(rec)
    return out


def alarm_threshold(cfg: Any, agent: Any) -> float:
    """The ``mean_abs`` above which ``agent``'s rollouts stop the run (0: never): ``--mismatch_alarm`` when given,
    else :data:`~openrlhf_hacpo.config.MISMATCH_ALARM` for an agent whose policy and engines both run in fp32 and 0
    where either is bf16 (``--bf16``, ``--engine_dtype bfloat16``: rounding every logit gives a gap of its own, see
    docs/training.md)."""
    if cfg.engines.mismatch_alarm is not None:
        return float(cfg.engines.mismatch_alarm)
    fp32 = agent.policy_dtype == agent.resolved_engine_dtype == "float32"
    return MISMATCH_ALARM if fp32 else 0.0


def check_mismatch(step: int, rollouts: Sequence[Any], agents: Sequence[Any], cfg: Any) -> None:
    """Raise :class:`TrainingError` naming the first agent (``agents``: their resolved configs, with ``name`` and
    ``bf16``) whose own rows' mean |logp_train − logp_engine| per token exceeds its :func:`alarm_threshold` (off
    with ``--one_step_off``)."""
    if cfg.train.one_step_off:
        return
    for agent, figures in zip(agents, _figures(rollouts)):
        threshold = alarm_threshold(cfg, agent)
        gap = figures.get("mean_abs")
        if threshold <= 0 or gap is None or gap <= threshold:
            continue
        synced = f"the weight sync after step {step - 1}" if step > 1 else "the engines' initial weights"
        raise TrainingError(
            f"step {step}: agent {agent.name!r}, rollout backend {cfg.rollout.rollout_backend}: the engine and the "
            f"trainer disagree on the sampled tokens' log-probs: mean |logp_train - logp_engine| per token {gap:.3g} > "
            f"--mismatch_alarm {threshold:.3g} (max {figures['max_abs']:.3g}, k3 KL {figures['k3_kl']:.3g}). The "
            f"engines sample from other weights than the learner scores with: check {synced} (every tensor copied, "
            f"names mapped, dtype and tied weights) and the engines' precision (a larger --mismatch_alarm for "
            f"lower-precision engines; 0 turns it off)", agent=agent.name, phase="rollout")
