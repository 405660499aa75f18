"""Reports of the tiny main job: a run's ``summary.json`` from the trainer's records, its before/after table and
validation plot, and the statistics over seeds that ``benchmarks/compare_tiny.py`` aggregates runs with.

All functions are pure functions of the records they are given, except the three that touch one file each:
:func:`read_records`, :func:`load_summary` and :func:`plot_validation` (an atomic write).

* per run: :func:`agent_step_stats` (totals and per-step means of one agent's ``metrics.jsonl`` records),
  :func:`final_accuracy` (mean of the last :data:`FINAL_EVALS` periodic evaluations), :func:`build_summary`,
  :func:`format_table`, :func:`plot_validation`;
* over seeds: :func:`mean_std` (mean and sample standard deviation s = sqrt(Σ (x − x̄)² / (n − 1))),
  :func:`aggregate_arm` (one arm's runs, one per seed), :func:`paired_differences` (two arms, paired by seed).
"""
from __future__ import annotations

import io
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from openrlhf_hacpo.algorithms.mismatch import MISMATCH_KEYS
from openrlhf_hacpo.utils.atomic import atomic_write_bytes
from openrlhf_hacpo.utils.jsonl import read_records

__all__ = [
    "FINAL_EVALS",
    "PLOT_FILE",
    "SUMMARY_FILE",
    "agent_step_stats",
    "aggregate_arm",
    "build_summary",
    "final_accuracy",
    "fmt",
    "fmt_pm",
    "format_table",
    "load_summary",
    "mean_std",
    "mismatch_stats",
    "paired_differences",
    "plot_validation",
    "read_records",
]

SUMMARY_FILE = "summary.json"
PLOT_FILE = "validation.png"
FINAL_EVALS = 2
"""The final accuracy of a run is the mean of its last this-many periodic evaluations."""


# ---------------------------------------------------------------------------------------------------------- one run
def final_accuracy(curve: Sequence[tuple[int, float]], last: int = FINAL_EVALS) -> float:
    """Mean accuracy of the last ``last`` evaluations of a ``[(step, accuracy), ...]`` curve (sorted by step)."""
    if not curve:
        raise ValueError("final_accuracy needs at least one evaluation")
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    tail = sorted(curve, key=lambda p: p[0])[-last:]
    return sum(a for _, a in tail) / len(tail)


_PHASES = {"generate": "time/generate", "logprob": "time/logprob", "update": "time/update",
           "reward": "time/reward", "sync": "time/sync", "step": "time/step"}
_FOREIGN = {"in_window_frac": "policy/foreign_in_window_frac", "ratio_mean": "policy/foreign_ratio_mean",
            "below_window_frac": "policy/foreign_clip_frac_lower", "above_window_frac": "policy/foreign_clip_frac_upper",
            "ratio_median": "policy/foreign_ratio_median", "pos_in_window_frac": "policy/foreign_pos_in_window_frac",
            "pos_below_window_frac": "policy/foreign_pos_clip_frac_lower",
            "pos_above_window_frac": "policy/foreign_pos_clip_frac_upper"}


def mismatch_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The engine-against-trainer log-prob figures of one agent's records (``mismatch/*``, see
    :mod:`openrlhf_hacpo.algorithms.mismatch`) over the run: ``own`` for its own rows and ``sources`` (``{source:
    figures}``) for each partner's rows, the source engine's log-probs against the source trainer's. Each figure is
    its mean over the steps that logged it, but ``max_abs``, the largest over them. ``None`` when no step logged
    the own figures (temperature other than 1, ``--old_logp_from_update``, ``--no_mismatch_metrics``)."""

    def figures(prefix: str) -> dict[str, float | None]:
        out = {k: _mean([r.get(prefix + k) for r in records]) for k in MISMATCH_KEYS if k != "max_abs"}
        peaks = [r[prefix + "max_abs"] for r in records if r.get(prefix + "max_abs") is not None]
        return {"max_abs": max(peaks) if peaks else None, **out}

    if not any("mismatch/mean_abs" in r for r in records):
        return None
    sources = sorted({k.split("/")[2] for r in records for k in r if k.startswith("mismatch/source/")})
    return {"own": figures("mismatch/"), "sources": {s: figures(f"mismatch/source/{s}/") for s in sources}}


def _mean(values: Sequence[float]) -> float | None:
    """Mean over steps of the finite values present (``None`` when none is)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def agent_step_stats(records: Sequence[Mapping[str, Any]], rollouts_per_step: int) -> dict[str, Any]:
    """Totals and per-step means of one agent's ``metrics.jsonl`` records.

    * ``steps``; ``rollouts_generated`` (own rollouts: ``view/num_own_rows`` summed, else
      ``rollouts_per_step`` per step); ``rows_trained`` (own + foreign rows, ``view/num_rows``);
    * ``generated_tokens`` (``response/tokens_mean`` × own rollouts) and ``tokens_per_s`` (generated tokens over
      generation seconds);
    * ``seconds``: mean seconds per step of each phase (generate, logprob, update, reward, sync, step) and
      ``samples_trained_per_s`` (rows trained over update seconds);
    * ``foreign``: per-step means of the foreign-ratio statistics (fraction of foreign rollouts in the clip
      window, below and above it, mean ratio; the median and the fractions among rows with A > 0 when the
      trainer logs them), or ``None`` when the agent
      trained on no foreign rollouts;
    * ``mismatch``: :func:`mismatch_stats`.
    """
    if not records:
        raise ValueError("agent_step_stats needs at least one step record")
    own = [float(r.get("view/num_own_rows", rollouts_per_step)) for r in records]
    rows = [float(r.get("view/num_rows", o)) for r, o in zip(records, own)]
    tokens = sum(float(r.get("response/tokens_mean", 0.0)) * o for r, o in zip(records, own))
    gen_s = sum(float(r.get("time/generate", 0.0)) for r in records)
    upd_s = sum(float(r.get("time/update", 0.0)) for r in records)
    seconds = {name: _mean([r.get(key) for r in records]) for name, key in _PHASES.items()}
    foreign = None
    if any(_FOREIGN["in_window_frac"] in r for r in records):
        foreign = {name: _mean([r.get(key) for r in records]) for name, key in _FOREIGN.items()}
    return {
        "steps": len(records),
        "rollouts_generated": int(round(sum(own))),
        "rows_trained": int(round(sum(rows))),
        "generated_tokens": int(round(tokens)),
        "tokens_per_s": tokens / gen_s if gen_s > 0 else None,
        "samples_trained_per_s": sum(rows) / upd_s if upd_s > 0 else None,
        "seconds": seconds,
        "foreign": foreign,
        "mismatch": mismatch_stats(records),
        "train_reward_last10": _mean([r.get("reward/mean") for r in records[-10:]]),
    }


def build_summary(
    *,
    run: Mapping[str, Any],
    acc_before: Mapping[str, float],
    acc_after: Mapping[str, float],
    step_records: Sequence[Mapping[str, Any]],
    eval_records: Sequence[Mapping[str, Any]],
    rollouts_per_step: int,
) -> dict[str, Any]:
    """``summary.json`` of a run from its before/after accuracies and the trainer's metrics / eval records.

    ``run`` carries the run-wide facts (preset, algorithm, seed, wall seconds, ...); ``rollouts_total`` is added.
    Per agent: ``acc_before``, ``acc_after``, ``acc_final`` (mean of the last two periodic evaluations),
    ``validation`` (``[[step, accuracy], ...]`` starting with step 0 = ``acc_before``) and
    :func:`agent_step_stats`.
    """
    agents: dict[str, Any] = {}
    for name in acc_before:
        mine = [r for r in step_records if r.get("agent") == name]
        curve = sorted((int(r["step"]), float(r["accuracy"])) for r in eval_records if r.get("agent") == name)
        entry: dict[str, Any] = {
            "acc_before": float(acc_before[name]),
            "acc_after": float(acc_after[name]),
            "acc_final": final_accuracy(curve) if curve else float(acc_after[name]),
            "validation": [[0, float(acc_before[name])]] + [[s, a] for s, a in curve if s > 0],
        }
        if mine:
            entry.update(agent_step_stats(mine, rollouts_per_step))
        else:
            entry.update(steps=0, rollouts_generated=0, rows_trained=0)
        agents[name] = entry
    out_run = dict(run)
    out_run["rollouts_total"] = sum(a["rollouts_generated"] for a in agents.values())
    return {"run": out_run, "agents": agents}


def format_table(summary: Mapping[str, Any], comparison: Mapping[str, Any] | None = None) -> str:
    """Before/after table of a summary, one row per agent (markdown).

    With a ``comparison`` (:func:`openrlhf_hacpo.zoo.reference.compare_with_reference`) that found the README's arm,
    each row also shows that arm's final accuracy over seeds (mean ± std, min–max, the same seed) and the range
    expected of one run; otherwise a line under the table says why there is no comparison."""
    run = summary["run"]
    used = run.get("agents_used") or {}
    lines = [
        f"preset {run.get('preset')} · {run.get('algorithm')} · seed {run.get('seed')} · "
        f"{run.get('steps')} steps · G={run.get('n_samples_per_prompt')}",
    ]
    if used:
        lines.append("agents: " + ", ".join(f"{n} {u['source']} {u['fingerprint']}" for n, u in used.items()))
    compared = comparison is not None and comparison.get("status") == "compared"
    head = "| agent | test acc. before | test acc. after | change | final (mean of last 2 evals) | rollouts generated |"
    rule = "|---|---|---|---|---|---|"
    if compared:
        n = len(comparison["seeds"])
        head += f" README final ({n} seeds) | README min–max | README same seed | expected for one run | typical |"
        rule += "---|---|---|---|---|"
    lines += ["", head, rule]
    for name, a in summary["agents"].items():
        row = (f"| {name} | {a['acc_before']:.3f} | {a['acc_after']:.3f} | {a['acc_after'] - a['acc_before']:+.3f} | "
               f"{a['acc_final']:.3f} | {a['rollouts_generated']:,} |")
        if compared:
            r = comparison["agents"][name]
            interval = r["interval"]
            row += (f" {fmt_pm(r['ref_mean'], r['ref_std'])} | {fmt(r['ref_min'])}–{fmt(r['ref_max'])} | "
                    f"{fmt(r['ref_same_seed'])} | "
                    + (f"{interval[0]:.3f}–{interval[1]:.3f}" if interval else "–") + " | "
                    + {True: "yes", False: "no", None: "–"}[r["typical"]] + " |")
        lines.append(row)
    gaps = {name: a["mismatch"]["own"] for name, a in summary["agents"].items() if a.get("mismatch")}
    if gaps:
        lines += ["", "engine against trainer log-probs on each agent's own rows (mismatch/*, mean over the steps):"]
        lines += [f"- {name}: mean |Δ| {_sci(g['mean_abs'])} per token (largest {_sci(g['max_abs'])}), "
                  f"k3 KL {_sci(g['k3_kl'])}" for name, g in gaps.items()]
    if comparison is not None:
        from openrlhf_hacpo.zoo.reference import format_reference_note

        lines += ["", format_reference_note(comparison)]
    return "\n".join(lines)


def plot_validation(summary: Mapping[str, Any], path: Path) -> Path:
    """PNG of each agent's greedy accuracy on the evaluation prompts against the training step (atomic write)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = summary["run"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, a in summary["agents"].items():
        steps = [s for s, _ in a["validation"]]
        accs = [v for _, v in a["validation"]]
        ax.plot(steps, accs, marker="o", markersize=3, label=f"{name} ({a['acc_before']:.2f} → {a['acc_after']:.2f})")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"greedy accuracy ({run.get('eval_problems', '')} {run.get('eval_split', 'test')} problems)")
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.set_title(f"{run.get('algorithm')} · preset {run.get('preset')} · seed {run.get('seed')}")
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of a run folder, or ``None`` when the run has not finished."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------------------- over seeds
def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (``None`` for fewer than two values)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _fmean(values: Sequence[Any]) -> float | None:
    """Mean over seeds of the values present (``None`` when none is)."""
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def aggregate_arm(summaries: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Per agent: final accuracy per seed and mean ± std, before/after, rollouts, throughput, phases, foreign stats,
    and the mean validation curve; run-wide: seeds and wall seconds."""
    seeds = sorted(summaries)
    first = summaries[seeds[0]]
    agents = {}
    for name in first["agents"]:
        per_seed = {s: summaries[s]["agents"][name] for s in seeds}
        finals = {s: a["acc_final"] for s, a in per_seed.items()}
        mean, std = mean_std(list(finals.values()))
        entries = list(per_seed.values())
        seconds = {k: _fmean([a["seconds"][k] for a in entries if a.get("seconds")])
                   for k in (entries[0].get("seconds") or {})}
        foreign = None
        if entries[0].get("foreign"):
            keys = dict.fromkeys(k for a in entries if a.get("foreign") for k in a["foreign"])
            foreign = {k: _fmean([a["foreign"].get(k) for a in entries if a.get("foreign")]) for k in keys}
        steps = sorted({s for a in entries for s, _ in a["validation"]})
        curve = []
        for st in steps:
            vals = [v for a in entries for s, v in a["validation"] if s == st]
            m, sd = mean_std(vals)
            curve.append([st, m, sd if sd is not None else 0.0])
        agents[name] = {
            "final_by_seed": {str(s): v for s, v in finals.items()},
            "final_mean": mean,
            "final_std": std,
            "acc_before": _fmean([a["acc_before"] for a in entries]),
            "acc_after_mean": _fmean([a["acc_after"] for a in entries]),
            "rollouts_generated": _fmean([a["rollouts_generated"] for a in entries]),
            "rows_trained": _fmean([a["rows_trained"] for a in entries]),
            "tokens_per_s": _fmean([a.get("tokens_per_s") for a in entries]),
            "samples_trained_per_s": _fmean([a.get("samples_trained_per_s") for a in entries]),
            "seconds": seconds,
            "foreign": foreign,
            "curve": curve,
            "rollouts_per_step": _fmean([a["rollouts_generated"] / max(a["steps"], 1) for a in entries]),
        }
    return {
        "seeds": seeds,
        "wall_seconds": _fmean([summaries[s]["run"]["wall_seconds"] for s in seeds]),
        "train_seconds": _fmean([summaries[s]["run"]["train_seconds"] for s in seeds]),
        "agents": agents,
    }


def paired_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Per agent: final accuracy of arm ``a`` minus arm ``b`` for every seed both have, their mean ± std."""
    out = {}
    for name, entry in a["agents"].items():
        other = b["agents"].get(name)
        if other is None:
            continue
        common = sorted(set(entry["final_by_seed"]) & set(other["final_by_seed"]), key=int)
        diffs = [entry["final_by_seed"][s] - other["final_by_seed"][s] for s in common]
        mean, std = mean_std(diffs)
        out[name] = {"seeds": [int(s) for s in common], "diffs": diffs, "mean": mean, "std": std,
                     "positive": sum(d > 0 for d in diffs)}
    return out


def fmt(value: float | None, digits: int = 3, signed: bool = False) -> str:
    """``value`` with ``digits`` decimals (a sign when ``signed``); ``–`` for ``None``."""
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _sci(value: float | None) -> str:
    """``value`` in scientific notation with two significant digits; ``–`` for ``None``."""
    return "–" if value is None else f"{value:.1e}"


def fmt_pm(mean: float | None, std: float | None, signed: bool = False) -> str:
    """``mean ± std`` (only the mean when ``std`` is ``None``; ``–`` without a mean)."""
    if mean is None:
        return "–"
    return fmt(mean, signed=signed) + (f" ± {std:.3f}" if std is not None else "")
