"""Tables and plots of ``benchmarks/throughput.py`` from the arm summaries of :mod:`throughput_stats`.

Every figure a run did not log is shown as "–"; a column is shown when at least one arm has the figure, so the
figures a newer trainer logs (``perf/*``, new ``time/*`` phases) get their columns without a change here.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from throughput_stats import ARM_RATIO_FIELDS

__all__ = ["fmt", "format_accuracy", "format_report", "plot_accuracy", "plot_report"]

DASH = "–"
_STEP_PHASE_LABELS = {"time/rollout_phase": "rollout phase", "time/reward": "reward", "time/train_phase":
                      "train phase", "time/sync": "weight sync", "other": "other"}
_RATIO_LABELS = {"step_s.median": "step s", "phases.time/rollout_phase": "rollout phase",
                 "phases.time/train_phase": "train phase", "phases.time/sync": "weight sync",
                 "rollouts_per_s": "rollouts/s", "tokens_generated_per_s": "generated tok/s",
                 "rows_trained_per_s": "trained rows/s", "tokens_trained_per_s": "trained tok/s",
                 "rows_backward": "rows backward", "tokens_backward": "tokens backward",
                 "peak_rss_gib": "peak RSS", "peak_pss_gib": "peak PSS", "cuda_max_allocated_gib": "GPU max alloc."}


def fmt(value: Any, digits: int | str = 2, suffix: str = "") -> str:
    """A number with ``digits`` decimals (thousands separated), or in scientific notation with 3 significant digits
    when ``digits`` is ``"e"`` (figures far below 1, such as log-prob gaps); "–" for ``None``."""
    if value is None:
        return DASH
    if digits == "e":
        return f"{value:.2e}{suffix}"
    return f"{value:,.{digits}f}{suffix}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _present(arms: Mapping[str, Mapping[str, Any]], getter) -> bool:
    return any(getter(a) is not None for a in arms.values())


def format_report(payload: Mapping[str, Any]) -> str:
    """The markdown report: settings, step time by phase, work and throughput, ratios to GSPO, per-agent phases."""
    arms: Mapping[str, Mapping[str, Any]] = payload["arms"]
    labels = {name: a["label"] for name, a in arms.items()}
    s = payload["settings"]
    lines = [f"# Throughput against GSPO: `{payload['config']}`", "",
             f"{payload['description']}. {s['rounds']} round(s) of {s['steps']} steps per arm, the first "
             f"{s['warmup']} of each run dropped; run order {' '.join(f'{a}' for _, a in payload['order'])}.",
             "", f"Command: `{payload['command']}`", "",
             f"Machine: {payload['machine']}. Commit: `{payload.get('commit', '?')}`. {payload.get('time', '')}",
             "", "## Step time (seconds, median over measured steps)", ""]
    phases = [k for k in _STEP_PHASE_LABELS if _present(arms, lambda a, k=k: a["phases"].get(k))]
    header = ["arm", "steps", "step s (q1–q3)", "× GSPO", "median of each run"] + [_STEP_PHASE_LABELS[k]
                                                                                   for k in phases]
    rows = []
    for name, a in arms.items():
        st = a["step_s"]
        runs = ", ".join(f"{m:.3f}" for m in a.get("run_medians", []))
        rows.append([labels[name], str(a["steps"]), f"{st['median']:.3f} ({st['q1']:.3f}–{st['q3']:.3f})",
                     fmt(a["ratios"].get("step_s.median")), runs or DASH]
                    + [fmt(a["phases"].get(k), 3) for k in phases])
    lines += _table(header, rows)

    lines += ["", "## Work and throughput", ""]
    columns = [("rollouts/step", lambda a: a.get("rollouts_per_step"), 0),
               ("rollouts/s", lambda a: a.get("rollouts_per_s"), 1),
               ("generated tok/s", lambda a: a.get("tokens_generated_per_s"), 0),
               ("trained rows/step", lambda a: a.get("rows_trained"), 0),
               ("trained tok/s", lambda a: a.get("tokens_trained_per_s"), 0),
               ("rows backward/step", lambda a: a.get("rows_backward"), 1),
               ("tokens backward/step", lambda a: a.get("tokens_backward"), 0),
               ("foreign rows → backward", lambda a: a.get("foreign_backward_share"), 3),
               ("pad. frac. scoring", lambda a: a.get("pad_frac_scoring"), 3),
               ("pad. frac. probe", lambda a: a.get("pad_frac_probe"), 3),
               ("pad. frac. update", lambda a: a.get("pad_frac_update"), 3),
               ("peak RSS Σ GiB", lambda a: a.get("peak_rss_gib"), 2),
               ("peak PSS Σ GiB", lambda a: a.get("peak_pss_gib"), 2),
               ("GPU max alloc. GiB", lambda a: a.get("cuda_max_allocated_gib"), 2)]
    always = {"rollouts/step", "rollouts/s", "generated tok/s", "trained rows/step", "trained tok/s",
              "rows backward/step", "tokens backward/step", "pad. frac. scoring", "pad. frac. update", "peak RSS Σ GiB"}
    columns = [c for c in columns if c[0] in always or _present(arms, c[1])]
    lines += _table(["arm"] + [c[0] for c in columns],
                    [[labels[n]] + [fmt(get(a), d) for _, get, d in columns] for n, a in arms.items()])

    ratio_fields = [f for f in ARM_RATIO_FIELDS if _present(arms, lambda a, f=f: a["ratios"].get(f))]
    lines += ["", "## Ratios to GSPO (arm / GSPO; seconds: > 1 is slower, rates: > 1 is faster)", ""]
    lines += _table(["arm"] + [_RATIO_LABELS[f] for f in ratio_fields],
                    [[labels[n]] + [fmt(a["ratios"].get(f), 3) for f in ratio_fields] for n, a in arms.items()])

    agent_keys: list[str] = []
    for a in arms.values():
        for ag in a["agents"].values():
            agent_keys += [k for k in ag["phases"] if k not in agent_keys]
    extra = [("foreign in window", "policy/foreign_in_window_frac", 3), ("rows/step", "view/num_rows", 0),
             ("rows backward/step", "perf/rows_backward", 1), ("pad. scoring", "perf/pad_frac_scoring", 3),
             ("pad. probe", "perf/pad_frac_probe", 3), ("pad. update", "perf/pad_frac_update", 3),
             ("mismatch mean abs", "mismatch/mean_abs", "e"), ("mismatch max abs", "mismatch/max_abs", "e"),
             ("mismatch k3 KL", "mismatch/k3_kl", "e")]
    extra = [e for e in extra if any(ag.get(e[1]) is not None for a in arms.values() for ag in a["agents"].values())]
    lines += ["", "## Per agent (median seconds of each phase; – : not logged by this run)", ""]
    rows = []
    for name, a in arms.items():
        for agent, ag in a["agents"].items():
            rows.append([labels[name], agent] + [fmt(ag["phases"].get(k), 3) for k in agent_keys]
                        + [fmt(ag.get(key), d) for _, key, d in extra])
    lines += _table(["arm", "agent"] + [k.removeprefix("time/") for k in agent_keys] + [e[0] for e in extra], rows)

    for note in payload.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


def format_accuracy(payload: Mapping[str, Any]) -> str:
    """The time-to-accuracy table: per agent, GSPO ×2's final accuracy, when each arm first reaches it."""
    s = payload["settings"]
    lines = [f"# Time to accuracy: `{payload['config']}`", "",
             f"{payload['description']}. {s['steps']} steps per run, evaluation every {s['eval_steps']} steps; "
             f"target = the final accuracy of {payload['reference_label']} (mean of its last "
             f"{payload['final_evals']} evaluations); seconds = training seconds (Σ time/step) up to the first "
             "evaluation at or above the target.", "", f"Command: `{payload['command']}`", "",
             f"Machine: {payload['machine']}. Commit: `{payload.get('commit', '?')}`. {payload.get('time', '')}", ""]
    arms = payload["arms"]
    header = ["agent", "target"]
    for name in arms:
        header += [f"{arms[name]['label']}: step", "seconds"]
    header += [f"{arms[n]['label']} / {payload['reference_label']}" for n in arms if n != payload["reference"]]
    rows = []
    for agent, target in payload["targets"].items():
        row = [agent, f"{target:.3f}"]
        for name in arms:
            hit = arms[name]["reached"].get(agent)
            row += [str(hit["step"]), f"{hit['seconds']:.1f}"] if hit else [
                f"not reached (best {arms[name]['best'][agent]:.3f})", DASH]
        row += [fmt(payload["ratios"][n].get(agent), 3) for n in arms if n != payload["reference"]]
        rows.append(row)
    lines += _table(header, rows)
    lines += ["", "Training seconds of the whole run: " + ", ".join(
        f"{arms[n]['label']} {arms[n]['train_seconds']:.1f} s" for n in arms) + "."]
    return "\n".join(lines) + "\n"


def plot_report(payload: Mapping[str, Any]) -> bytes:
    """PNG: (left) each arm's median phase seconds stacked, with the step median and its interquartile range;
    (right) step seconds, rollouts/s and trained tokens/s as ratios to GSPO."""
    from results_io import figure_png, pyplot

    plt = pyplot()

    arms = payload["arms"]
    names = list(arms)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    x = range(len(names))
    bottom = [0.0] * len(names)
    for key, label in _STEP_PHASE_LABELS.items():
        vals = [max(arms[n]["phases"].get(key) or 0.0, 0.0) for n in names]
        if any(vals):
            ax1.bar(x, vals, bottom=bottom, label=label, width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
    med = [arms[n]["step_s"]["median"] for n in names]
    err = [[m - arms[n]["step_s"]["q1"] for m, n in zip(med, names)],
           [arms[n]["step_s"]["q3"] - m for m, n in zip(med, names)]]
    ax1.errorbar(x, med, yerr=err, fmt="D", color="black", capsize=4, label="step (median, q1–q3)")
    ax1.set_xticks(list(x), [arms[n]["label"] for n in names], rotation=15)
    ax1.set_ylabel("seconds per step")
    ax1.set_title(f"step time by phase · {payload['config']}")
    ax1.legend(fontsize=7)
    fields = [("step_s.median", "step s"), ("rollouts_per_s", "rollouts/s"), ("tokens_trained_per_s", "trained tok/s")]
    width = 0.8 / len(fields)
    for i, (field, label) in enumerate(fields):
        vals = [arms[n]["ratios"].get(field) or 0.0 for n in names]
        ax2.bar([j + (i - (len(fields) - 1) / 2) * width for j in x], vals, width=width, label=label)
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_xticks(list(x), [arms[n]["label"] for n in names], rotation=15)
    ax2.set_ylabel("ratio to GSPO")
    ax2.set_title("ratios to GSPO")
    ax2.legend(fontsize=7)
    return figure_png(fig)


def plot_accuracy(payload: Mapping[str, Any]) -> bytes:
    """PNG: each agent's evaluation accuracy against training seconds, one line per arm, the target dashed."""
    from results_io import figure_png, pyplot

    plt = pyplot()

    agents = list(payload["targets"])
    fig, axes = plt.subplots(1, len(agents), figsize=(5.2 * len(agents), 3.8), dpi=110, squeeze=False)
    for ax, agent in zip(axes[0], agents):
        for name, arm in payload["arms"].items():
            curve = arm["curves"].get(agent, [])
            ax.plot([c[2] for c in curve], [c[1] for c in curve], marker="o", markersize=3, label=arm["label"])
        ax.axhline(payload["targets"][agent], linestyle="--", color="gray", linewidth=0.8, label="target")
        ax.set_xlabel("training seconds (Σ time/step)")
        ax.set_ylabel("greedy accuracy")
        ax.set_title(agent)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return figure_png(fig)
