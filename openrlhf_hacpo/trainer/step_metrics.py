"""One metrics record per agent and step: what the step's phases measured, in the names ``metrics.jsonl`` uses.

Times (seconds): ``time/generate`` and ``time/scoring`` (the agent's sampling and old-log-prob recompute, its
slowest rank), ``time/engine_generate`` (the slowest engine actor's own time in its ``generate`` call, where
``time/generate``, timed by the driver, runs until the driver reads the outputs: after the updates in a
``--one_step_off`` step; with the ``hf`` backend the policy's ``generate`` phase), ``time/rollout_rest`` (the rest
of its policy actor's rollout call), ``time/view``,
``time/advantages``, ``time/reference``, ``time/probe`` and ``time/update`` (its learner's parts of the training
phase, slowest rank), ``time/train_rest`` (the rest of the learner's call: planning, reductions, results),
``time/logprob`` (scoring + reference, kept for earlier reports), ``time/wait`` (how long the agent idled inside the
rollout and training phases while other agents worked),
and the driver's ``time/reward``, ``time/capability``, ``time/sync``, ``time/rollout_phase``, ``time/train_phase``,
``time/step``. Work: ``perf/tokens_generated``, and from the learner ``perf/rows_trained`` / ``perf/tokens_trained``
(rows of its view) and ``perf/rows_backward`` / ``perf/tokens_backward`` (those that went through a backward pass).
Staleness: ``rollout/staleness_max`` / ``rollout/staleness_mean``, over the rows the learner trains on, of its
weights version minus the version that generated the row (0 in synchronous training, 1 with ``--one_step_off`` from
step 2 on).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from openrlhf_hacpo.actors.results import RolloutResult, TrainStepResult
from openrlhf_hacpo.algorithms import CapabilityRatios, CapabilityStep
from openrlhf_hacpo.rollout import Trajectory

__all__ = ["LEARNER_PHASES", "ROLLOUT_PHASES", "agent_step_record", "step_records"]

LEARNER_PHASES = ("view", "advantages", "reference", "probe", "update", "train_rest")
"""The parts of a learner's training step, timed by the update loop; ``train_rest``: the rest of the policy actor's
call (planning, metric reductions, results)."""

ROLLOUT_PHASES = ("generate", "scoring", "rollout_rest")
"""The parts of an agent's rollout (:attr:`~openrlhf_hacpo.actors.results.RolloutResult.timings`); ``rollout_rest``:
the rest of the policy actor's call (results built)."""


def agent_step_record(step: int, agent: int, agent_names: Sequence[str], summary: Mapping[str, float],
                      own: Sequence[Trajectory], capability: CapabilityStep, ratios: CapabilityRatios,
                      rollout: RolloutResult, trained: TrainStepResult, phases: Mapping[str, float],
                      sync_s: float, staleness: Sequence[int] = ()) -> dict[str, Any]:
    """The record of agent ``agent`` for ``step``: rewards and responses of its rollouts (``summary``: the
    :meth:`~openrlhf_hacpo.rollout.RolloutStore.summary` entry of the agent), capability, phase times, update
    counts, ω to every other agent and the learner's own metrics.

    ``phases`` holds the driver's seconds: ``rollout_phase``, ``reward``, ``capability``, ``train_phase``, ``step``.
    ``staleness`` holds, per row the learner trains on, its version minus the row's ``policy_version``
    (``rollout/staleness_max`` and ``rollout/staleness_mean``; absent when empty).
    """
    sampler = {name: float(rollout.timings.get(name, 0.0)) for name in ROLLOUT_PHASES}
    learner = {name: float(trained.timings.get(name, 0.0)) for name in LEARNER_PHASES}
    wait = (max(phases["rollout_phase"] - sum(sampler.values()), 0.0)
            + max(phases["train_phase"] - sum(learner.values()), 0.0))
    rec: dict[str, Any] = {
        "step": step,
        "agent": agent_names[agent],
        "reward/mean": summary["reward_mean"],
        "reward/std": summary["reward_std"],
        "reward/positive_rate": summary["positive_rate"],
        "capability": float(capability.smoothed[agent]),
        "capability/step": float(capability.step[agent]),
        "response/tokens_mean": summary["response_tokens_mean"],
        "response/chars_mean": summary["response_chars_mean"],
        "response/finished_rate": summary["finished_rate"],
        "response/truncated_fraction": float(np.mean([t.finish_reason == "length" for t in own])),
        "rollout/tokens_per_s": rollout.generated_tokens / max(sampler["generate"], 1e-9),
        "perf/tokens_generated": float(rollout.generated_tokens),
        **({"perf/pad_frac_scoring": 1.0 - rollout.scoring_tokens / rollout.scoring_positions}
           if rollout.scoring_positions else {}),
        **{f"time/{name}": seconds for name, seconds in sampler.items()},
        "time/engine_generate": float(rollout.timings.get("engine_generate", sampler["generate"])),
        "time/reward": phases["reward"],
        "time/capability": phases["capability"],
        **{f"time/{name}": seconds for name, seconds in learner.items()},
        "time/logprob": sampler["scoring"] + learner["reference"],
        "time/sync": sync_s,
        "time/wait": wait,
        "time/rollout_phase": phases["rollout_phase"],
        "time/train_phase": phases["train_phase"],
        "time/step": phases["step"],
        "updates": trained.updates,
        "skipped_updates": trained.skipped_updates_total,
        "skipped_updates/step": trained.skipped_updates,
    }
    if len(staleness):
        rec["rollout/staleness_max"] = float(max(staleness))
        rec["rollout/staleness_mean"] = float(np.mean(staleness))
    weights = ratios.baseline_weights(agent)
    for j, name in enumerate(agent_names):
        if j != agent:
            rec[f"omega/{name}"] = float(weights[j])
    rec.update(trained.metrics)
    return rec


def step_records(step: int, agent_names: Sequence[str], summary: Sequence[Mapping[str, float]],
                 trajectories: Sequence[Trajectory], capability: CapabilityStep, ratios: CapabilityRatios,
                 rollouts: Sequence[RolloutResult], trained: Sequence[TrainStepResult], phases: Mapping[str, float],
                 sync_s: Sequence[float], versions: Sequence[int], trains_on_foreign: bool) -> list[dict[str, Any]]:
    """Every agent's :func:`agent_step_record` for ``step``; the staleness of agent k counts the rows its learner
    trained on (every agent's with ``trains_on_foreign``, hacpo / naive; its own otherwise) against ``versions[k]``,
    the learner's weights version when it trained."""
    records = []
    for k, (rollout, result) in enumerate(zip(rollouts, trained)):
        own = [t for t in trajectories if t.source == k]
        rows = list(trajectories) if trains_on_foreign else own
        records.append(agent_step_record(step, k, agent_names, summary[k], own, capability, ratios, rollout, result,
                                         phases, sync_s[k], staleness=[versions[k] - t.policy_version for t in rows]))
    return records
