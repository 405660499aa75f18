"""The training-inference mismatch of a comparison's runs, step by step: what ``compare_tiny.py --arms mismatch`` reports
beside the accuracies.

Every run logs, per agent and step, the ``mismatch/*`` figures of its own rows (the sampling engine's against the
trainer's log-probs of the sampled tokens; :mod:`openrlhf_hacpo.algorithms.mismatch`) and, with ``--rollout_is``, the
correction's ``policy/rollout_is_*`` figures (the mean applied weight and the shares of units truncated or masked;
:mod:`hacpo_kernels.hacpo_loss`). :func:`mismatch_over_training` averages them over an arm's seeds at every step,
:func:`mismatch_lines` tables their means over the first and the last ten steps, and :func:`render_mismatch_plot`
draws the mean |Δ| per token (log scale) and the correction's masked or truncated share against the step.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from openrlhf_hacpo.utils.jsonl import read_records

__all__ = ["CURVE_KEYS", "mismatch_over_training", "mismatch_lines", "render_mismatch_plot"]

CURVE_KEYS = (
    "mismatch/mean_abs", "mismatch/k3_kl", "mismatch/seq_log_ratio_std",
    "policy/rollout_is_own_weight_mean", "policy/rollout_is_own_truncated_frac", "policy/rollout_is_own_masked_frac",
    "policy/rollout_is_foreign_weight_mean", "policy/rollout_is_foreign_truncated_frac",
    "policy/rollout_is_foreign_masked_frac",
)
"""The per-step figures followed (a run that did not log one, e.g. a run without ``--rollout_is``, leaves it out)."""
WINDOW = 10
"""Steps averaged at the start and at the end of training in the table."""


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def mismatch_over_training(run_dirs: Sequence[Path], agents: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{agent: {key: [[step, mean over seeds, std over seeds, seeds], ...]}}`` of every :data:`CURVE_KEYS` figure
    the runs in ``run_dirs`` logged (``metrics.jsonl``), at each step at least one run logged it."""
    by_agent: dict[str, dict[str, dict[int, list[float]]]] = {a: {} for a in agents}
    for folder in run_dirs:
        path = Path(folder) / "metrics.jsonl"
        if not path.is_file():
            continue
        for record in read_records(path):
            agent = record.get("agent")
            if agent not in by_agent:
                continue
            for key in CURVE_KEYS:
                value = record.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    by_agent[agent].setdefault(key, {}).setdefault(int(record["step"]), []).append(float(value))
    out: dict[str, dict[str, Any]] = {}
    for agent, keys in by_agent.items():
        out[agent] = {key: [[step, *_mean_std(vals), len(vals)] for step, vals in sorted(steps.items())]
                      for key, steps in keys.items()}
    return out


def _window_mean(rows: Sequence[Sequence[float]], first: bool) -> float | None:
    picked = rows[:WINDOW] if first else rows[-WINDOW:]
    return sum(r[1] for r in picked) / len(picked) if picked else None


def _cell(value: float | None, digits: str = ".2e") -> str:
    return "–" if value is None else format(value, digits)


def mismatch_lines(curves: Mapping[str, Mapping[str, Mapping[str, Any]]], labels: Mapping[str, str]) -> list[str]:
    """The markdown section: per arm and agent, the mean over the first and the last :data:`WINDOW` steps (each the
    mean over seeds) of the own rows' mean |Δ| per token and k3 KL, and of the correction's weight and shares."""
    if not curves:
        return []
    lines = ["", "## Training-inference mismatch (own rows, mean over seeds; first / last 10 steps)", "",
             "mean |Δ| = mean over the sampled tokens of |log π_trainer − log π_engine| (the learner's old log-probs "
             "against the engine's that sampled them); k3 KL; with `--rollout_is`, the correction's mean weight on own "
             "units and the share of own units it truncated or masked (foreign rows: `_mismatch.png` and the json). "
             "Curves in the report's `_mismatch.png`.", "",
             "| arm | agent | mean \\|Δ\\| | k3 KL | seq log-ratio std | IS weight | truncated | masked |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, per_agent in curves.items():
        for agent, keys in per_agent.items():
            def pair(key: str, digits: str = ".2e") -> str:
                rows = keys.get(key) or []
                if not rows:
                    return "–"
                return f"{_cell(_window_mean(rows, True), digits)} / {_cell(_window_mean(rows, False), digits)}"
            lines.append(f"| {labels.get(arm, arm)} | {agent} | {pair('mismatch/mean_abs')} | "
                         f"{pair('mismatch/k3_kl')} | {pair('mismatch/seq_log_ratio_std')} | "
                         f"{pair('policy/rollout_is_own_weight_mean', '.4f')} | "
                         f"{pair('policy/rollout_is_own_truncated_frac', '.3f')} | "
                         f"{pair('policy/rollout_is_own_masked_frac', '.3f')} |")
    return lines


def render_mismatch_plot(curves: Mapping[str, Mapping[str, Mapping[str, Any]]], labels: Mapping[str, str],
                         title: str) -> bytes:
    """Two rows of panels, one column per agent: the own rows' mean |Δ| per token (log scale, mean ± std over seeds)
    and the correction's truncated or masked share of own units, against the step, one line per arm."""
    from results_io import figure_png, pyplot

    plt = pyplot()

    agents = sorted({a for per_agent in curves.values() for a in per_agent})
    fig, axes = plt.subplots(2, len(agents), figsize=(5.4 * len(agents), 7.0), dpi=110, squeeze=False)
    for j, agent in enumerate(agents):
        top, bottom = axes[0][j], axes[1][j]
        for arm, per_agent in curves.items():
            keys = per_agent.get(agent, {})
            rows = keys.get("mismatch/mean_abs") or []
            if rows:
                steps = [r[0] for r in rows]
                line, = top.plot(steps, [r[1] for r in rows], linewidth=1.2, label=labels.get(arm, arm))
                top.fill_between(steps, [max(r[1] - r[2], 1e-12) for r in rows], [r[1] + r[2] for r in rows],
                                 color=line.get_color(), alpha=0.12)
            for key, style in (("policy/rollout_is_own_truncated_frac", "-"),
                               ("policy/rollout_is_own_masked_frac", "--")):
                rows = keys.get(key) or []
                if rows and any(r[1] > 0 for r in rows):
                    bottom.plot([r[0] for r in rows], [r[1] for r in rows], style, linewidth=1.1,
                                label=f"{labels.get(arm, arm)}: {key.rsplit('_', 2)[-2]}")
        top.set_yscale("log")
        top.set_title(f"{agent}: own rows, mean |Δ log-prob| per token", fontsize=9)
        top.set_xlabel("step")
        top.grid(alpha=0.3)
        top.legend(fontsize=7)
        bottom.set_title(f"{agent}: own units the correction truncated (solid) or masked (dashed)", fontsize=9)
        bottom.set_xlabel("step")
        bottom.set_ylabel("share of own units")
        bottom.grid(alpha=0.3)
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=7)
    return figure_png(fig, title, fontsize=10)
