"""Where a partner's rollouts fall against HACPO's foreign window, and why: successes and failures apart.

    python benchmarks/window_probe.py                        # presets model and state, the shipped agents
    python benchmarks/window_probe.py --presets model --num_prompts 32

For a learner k and a source j, a foreign rollout's sequence ratio is s = exp(mean_k − mean_j), the mean
log-probabilities of its tokens under the learner (its chat template, its tokens) and under the source (eq. 11, as
the trainer computes it, EOS not scored). The window keeps s in [1 − δ + m·δ_step, 1]. This script samples each
agent's rollouts (64 validation prompts × G at T = 1), scores every other agent's under the learner and reports, for
the source's correct and wrong samples apart:

* the quantiles (10, 25, 50, 75, 90%) of s and the fractions below, inside and above [0.8, 1];
* the median mean log-probability per token under the learner and under the source, and the median token counts
  on both sides (the re-tokenisation);
* the median of the *sum*-normalised ratio exp(Σ_k − Σ_j), which a ratio without length normalisation would use.

Three explanations of "successes sit at or above the window's edge" can then be told apart: the **tokenizers** (then
the preset with one tokenizer, ``state``, would not show it), the **length normalisation** (then the mean and the sum
forms would differ in where successes sit), or the **task** (a correct worked addition is one near-deterministic
string, so both models give it a per-token log-probability near 0 and s ≈ exp(0 − 0) = 1, while a failure carries a
token the source sampled by chance and the learner finds unlikely).

``compare_tiny.py`` calls :func:`ratio_probes` for its report (the warm-started agents and the end of its seed-0
sharing runs), and :func:`window_over_training` / :func:`render_window_plot` for the trainer's per-step fractions.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

WINDOW = (0.8, 1.0)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
SPLITS = {"pos": "A > 0 (a success above its group's baseline)", "neg": "A < 0 (a failure below it)"}
FRACTIONS = {"below": "clip_frac_lower", "in": "in_window_frac", "above": "clip_frac_upper"}


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of ``values`` (linear interpolation between order statistics); ``None`` if empty."""
    import numpy as np

    return float(np.quantile(list(values), q)) if len(values) else None


def ratio_quantiles(ratios: Sequence[float], window: tuple[float, float] = WINDOW) -> dict[str, Any]:
    """Fractions of ``ratios`` below / inside / above ``window``, their median and quantiles (``None`` if empty)."""
    if not ratios:
        return {"n": 0, "in_window": None, "below": None, "above": None, "median": None,
                "quantiles": {str(q): None for q in QUANTILES}}
    lo, hi = window
    n = len(ratios)
    return {"n": n, "in_window": sum(lo <= r <= hi for r in ratios) / n, "below": sum(r < lo for r in ratios) / n,
            "above": sum(r > hi for r in ratios) / n, "median": statistics.median(ratios),
            "quantiles": {str(q): quantile(ratios, q) for q in QUANTILES}}


def _scores(model, prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_id: int
            ) -> list[tuple[float, float, int]]:
    """(mean, sum, token count) of each response's token log-probabilities given its prompt (T = 1), scored as the
    trainer scores rows (:func:`openrlhf_hacpo.models.score_logprobs`)."""
    from openrlhf_hacpo.models import score_logprobs

    logps = score_logprobs(model, prompts, responses, pad_id, 1.0, 128, next(model.parameters()).device)
    out = []
    for row in logps:
        values = row.tolist()
        out.append((sum(values) / len(values), sum(values), len(values)))
    return out


def _side(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The statistics of one group (correct or wrong samples) of a learner ← source pair."""
    def median(key):
        return statistics.median([r[key] for r in rows]) if rows else None

    return {**ratio_quantiles([r["s"] for r in rows]), "learner_logp_mean": median("learner_mean"),
            "source_logp_mean": median("source_mean"), "learner_tokens": median("learner_tokens"),
            "source_tokens": median("source_tokens"),
            "sum_ratio_median": (statistics.median([math.exp(max(min(r["learner_sum"] - r["source_sum"], 10.0),
                                                                 -10.0)) for r in rows]) if rows else None)}


def foreign_ratio_probe(folders: Mapping[str, Path], prompts: Sequence[Any], group_size: int = 8, seed: int = 0,
                        max_new_tokens: int = 40) -> dict[str, Any]:
    """The module docstring's statistics for every learner ← source pair of the policies in ``folders``
    (``{"<learner> <- <source>": {"all": ..., "correct": ..., "wrong": ..., "source_accuracy": ...}}``); the
    trainer's cross-agent ratio with ``eos_policy="drop"`` (the learner re-renders the prompt with its chat template
    and re-tokenizes the response text; the source side re-tokenizes its own text too)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openrlhf_hacpo.data import arithmetic_reward
    from openrlhf_hacpo.rollout.views import LearnerViewConfig, encode_response, render_prompt_ids
    from openrlhf_hacpo.zoo import generate_responses

    view = LearnerViewConfig(eos_policy="drop", apply_chat_template=True, enable_thinking=False)
    agents = {}
    for name, folder in folders.items():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        agents[name] = (model, tokenizer)
    samples: dict[str, list[dict[str, Any]]] = {}
    for name, (model, tokenizer) in agents.items():
        texts = generate_responses(model, tokenizer, prompts, do_sample=True, num_return_sequences=group_size,
                                   max_new_tokens=max_new_tokens, seed=seed)
        rows = [(p, t) for p, ts in zip(prompts, texts) for t in ts]
        rows = [(p, t) for p, t in rows if encode_response(t, tokenizer)]
        own = _scores(model, [render_prompt_ids(p.messages, tokenizer, view) for p, _ in rows],
                      [encode_response(t, tokenizer) for _, t in rows], tokenizer.pad_token_id)
        samples[name] = [{"prompt": p, "text": t, "source_mean": m, "source_sum": s_, "source_tokens": n,
                          "correct": arithmetic_reward(t, p.label) > 0} for (p, t), (m, s_, n) in zip(rows, own)]
    out = {}
    for learner, (model, tokenizer) in agents.items():
        for source, rows in samples.items():
            if source == learner:
                continue
            rows = [r for r in rows if encode_response(r["text"], tokenizer)]
            mine = _scores(model, [render_prompt_ids(r["prompt"].messages, tokenizer, view) for r in rows],
                           [encode_response(r["text"], tokenizer) for r in rows], tokenizer.pad_token_id)
            scored = [{**r, "learner_mean": m, "learner_sum": s_, "learner_tokens": n,
                       "s": math.exp(max(min(m - r["source_mean"], 10.0), -10.0))} for r, (m, s_, n) in zip(rows, mine)]
            correct = [r for r in scored if r["correct"]]
            wrong = [r for r in scored if not r["correct"]]
            out[f"{learner} <- {source}"] = {
                "all": ratio_quantiles([r["s"] for r in scored]), "correct": _side(correct), "wrong": _side(wrong),
                "source_accuracy": len(correct) / len(scored) if scored else None}
    return out


def ratio_probes(root: Path, preset, targets: Mapping[str, Mapping[str, Path]], num_prompts: int = 64,
                 log=print) -> dict[str, Any]:
    """:func:`foreign_ratio_probe` of each ``{label: {agent: folder}}`` of ``targets`` on the first ``num_prompts``
    validation problems, cached in ``<root>/ratio_probe.json`` (by label and folders)."""
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.utils.atomic import atomic_write_json

    cache_path = root / "ratio_probe.json"
    cache = json.loads(cache_path.read_text(encoding="utf-8")) if cache_path.is_file() else {}
    prompts = make_splits().validation[:num_prompts]
    changed = False
    out = {}
    for label, folders in targets.items():
        key = f"v2 | {label} | " + ",".join(str(folders[n]) for n in preset.agent_names)
        if key not in cache:
            log(f"ratio probe: {label}")
            cache[key] = foreign_ratio_probe(folders, prompts, preset.rl.group_size)
            changed = True
        out[label] = cache[key]
    if changed:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache_path, cache)
    return out


def probe_lines(probes: Mapping[str, Any]) -> list[str]:
    """Markdown tables of :func:`ratio_probes`: correct and wrong samples apart."""
    def f(x, digits=3):
        return "–" if x is None else f"{x:.{digits}f}"

    lines = ["| policies | learner ← source | samples | n | s: 10% / 25% / 50% / 75% / 90% | below / in / above "
             "[0.8, 1] | mean log p per token, learner / source | tokens, learner / source | median exp(Σ − Σ) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, pairs in probes.items():
        for pair, st in pairs.items():
            for side in ("correct", "wrong"):
                d = st[side]
                qs = " / ".join(f(d["quantiles"][str(q)]) for q in QUANTILES)
                lines.append(f"| {label} | {pair} | {side} | {d['n']} | {qs} | {f(d['below'])} / {f(d['in_window'])} / "
                             f"{f(d['above'])} | {f(d['learner_logp_mean'])} / {f(d['source_logp_mean'])} | "
                             f"{f(d['learner_tokens'], 0)} / {f(d['source_tokens'], 0)} | {f(d['sum_ratio_median'])} |")
    return lines


# ------------------------------------------------------------------------------------------------ over training
def window_over_training(run_dirs: Sequence[Path], agents: Sequence[str]) -> dict[str, list[list[float]]]:
    """Per learner, the mean over runs of the trainer's per-step fractions of foreign rows below / inside / above the
    window, with A > 0 and A < 0 apart: ``{agent: [[step, pos_below, pos_in, pos_above, neg_below, neg_in,
    neg_above], ...]}`` (steps where a run logged none of a kind are left out of that kind's mean)."""
    sums: dict[str, dict[int, list[list[float]]]] = {a: {} for a in agents}
    for run in run_dirs:
        path = Path(run) / "metrics.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("agent") not in sums:
                continue
            values = [r.get(f"policy/foreign_{sign}_{FRACTIONS[k]}") for sign in SPLITS for k in FRACTIONS]
            sums[r["agent"]].setdefault(int(r["step"]), []).append(values)
    out = {}
    for agent, by_step in sums.items():
        rows = []
        for step in sorted(by_step):
            cols = list(zip(*by_step[step]))
            rows.append([float(step)] + [statistics.fmean([v for v in c if v is not None])
                                         if any(v is not None for v in c) else float("nan") for c in cols])
        out[agent] = rows
    return out


def render_window_plot(curves: Mapping[str, Mapping[str, list[list[float]]]], title: str) -> bytes:
    """One panel per arm and learner: the fractions of :func:`window_over_training` against the step."""
    from results_io import figure_png, pyplot

    plt = pyplot()

    arms = list(curves)
    agents = sorted({a for c in curves.values() for a in c})
    fig, axes = plt.subplots(len(arms), len(agents), figsize=(5.0 * len(agents), 3.4 * len(arms)), dpi=110,
                             squeeze=False)
    styles = {"below": ":", "in": "-", "above": "--"}
    for i, arm in enumerate(arms):
        for j, agent in enumerate(agents):
            ax = axes[i][j]
            rows = curves[arm].get(agent) or []
            steps = [r[0] for r in rows]
            for s_i, sign in enumerate(SPLITS):
                color = "tab:green" if sign == "pos" else "tab:red"
                for k_i, kind in enumerate(FRACTIONS):
                    ax.plot(steps, [r[1 + 3 * s_i + k_i] for r in rows], styles[kind], color=color, linewidth=1.2,
                            label=f"{'A>0' if sign == 'pos' else 'A<0'} {kind}")
            ax.set_title(f"{arm}: learner {agent}", fontsize=9)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.set_ylabel("fraction of foreign rows")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, ncol=2)
    return figure_png(fig, title, fontsize=10)


def main(argv: Sequence[str] | None = None) -> int:
    from results_io import ResultWriter

    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.shipped import agent_folders

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="model,state", help="comma-separated zoo presets")
    parser.add_argument("--num_prompts", type=int, default=64)
    parser.add_argument("--results_dir", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    presets = [get_preset(p.strip()) for p in args.presets.split(",") if p.strip()]
    command = "python benchmarks/window_probe.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with ResultWriter("window_probe", args.results_dir, command=command.strip(), name="window_probe") as out:
        report = {}
        for preset in presets:
            folders = agent_folders(preset.agents, progress=True, jobs=1)
            report[preset.name] = ratio_probes(REPO / "runs" / "window_probe" / preset.name, preset,
                                               {f"{preset.name}: warm-started agents": folders}, args.num_prompts)
        lines = ["# Foreign ratios of correct and wrong samples against HACPO's window", "",
                 f"Made by: `{command.strip()}`", "", " ".join(__doc__.split("\n\n")[2].split()), "",
                 "Columns: the quantiles of s; the fractions below, inside and above [0.8, 1]; the median mean "
                 "log-probability per token under the learner and under the source; the median token counts; the "
                 "median of the sum-normalised ratio exp(Σ_k − Σ_j).", ""]
        for preset_probes in report.values():
            lines += probe_lines(preset_probes) + [""]
        markdown = "\n".join(lines)
        out.commit({".json": report, ".md": markdown})
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
