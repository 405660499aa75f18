"""HACPO with the one-step-off schedule on the tiny agents, beside synchronous HACPO: same preset, seeds, prompts.

    python benchmarks/compare_tiny_overlap.py                  # hacpo-overlap, seeds 0-4, 80 steps, 2 runs at a time
    python benchmarks/compare_tiny_overlap.py --arm hacpo-overlap-recompute --seeds 0,1
    python benchmarks/compare_tiny_overlap.py --report_only    # the table again from the runs on disk

The runs are an overlap arm of ``benchmarks/compare_tiny.py`` (its runs folder, commands and checks): HACPO with
``--rollout_backend hf_engine --one_step_off`` and ``--own_old_logp behaviour`` (``hacpo-overlap``, what ``auto``
chooses at temperature 1) or ``recompute`` (``hacpo-overlap-recompute``). The synchronous side is not run again: it
is the ``hacpo`` arm of the committed ``benchmarks/results/tiny_model.json`` (5 seeds, the same shipped agents,
checked by their weights' fingerprints), paired by seed (same seed, same prompt batches); with the ``hf`` backend,
whose sampled tokens ``hf_engine`` repeats exactly at equal weights.

The report gives each agent's final greedy test accuracy (mean of the last two evaluations) per seed and over seeds,
the paired differences, whether the overlap's mean lies inside the synchronous seed spread (mean ± std), and the
first evaluation step at which the mean accuracy over seeds reaches GSPO ×2's final accuracy (the committed
``gspo2x`` arm) for both schedules. Wall seconds are those of runs made two at a time on a shared machine; the time to
accuracy of the two schedules measured alone is ``benchmarks/throughput.py --time_to_accuracy``'s.

Writes ``benchmarks/results/tiny_model_<arm>.{md,json}`` through :class:`results_io.ResultWriter` (only when every
run succeeded; else ``tiny_model_<arm>.failed.md``).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
for _p in (str(REPO), str(REPO / "benchmarks")):
    if _p not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, _p)

import compare_tiny  # noqa: E402
from compare_tiny_lora import full_parameter_arm  # noqa: E402
from results_io import ResultWriter  # noqa: E402

from openrlhf_hacpo.zoo.reports import aggregate_arm, fmt, fmt_pm, paired_differences  # noqa: E402

PRESET = "model"
ARMS = tuple(name for name, arm in compare_tiny.ARMS.items() if arm.kind == "overlap")


def first_step_at(curve: Sequence[Sequence[float]], target: float) -> int | None:
    """The first evaluation step of ``curve`` ([step, mean, std] rows) whose mean is at or above ``target``."""
    return next((int(row[0]) for row in curve if row[1] >= target), None)


def inside_spread(value: float, mean: float, std: float) -> str:
    """Where ``value`` lies against ``mean ± std``: "inside", "above" or "below"."""
    return "inside" if abs(value - mean) <= std else ("above" if value > mean else "below")


def summarize(sync: Mapping[str, Any], overlap: Mapping[str, Any], targets: Mapping[str, float]) -> dict[str, Any]:
    """Per agent: the finals of both schedules, where the overlap's mean lies against the synchronous spread, and the
    first step at which each schedule's mean curve reaches ``targets[agent]``."""
    out = {}
    for agent, target in targets.items():
        s, o = sync["agents"][agent], overlap["agents"][agent]
        out[agent] = {"target": target, "sync_final": [s["final_mean"], s["final_std"]],
                      "overlap_final": [o["final_mean"], o["final_std"]],
                      "overlap_vs_spread": inside_spread(o["final_mean"], s["final_mean"], s["final_std"]),
                      "sync_step": first_step_at(s["curve"], target), "overlap_step": first_step_at(o["curve"], target)}
    return out


def render(arm: str, sync: Mapping[str, Any], overlap: Mapping[str, Any], summary: Mapping[str, Any],
           meta: Mapping[str, Any]) -> str:
    """The markdown report (see the module's docstring)."""
    agents = list(meta["agents"])
    seeds = [int(s) for s in overlap["seeds"]]
    label = compare_tiny.ARMS[arm].label
    made_by, measured = compare_tiny.provenance_lines(meta)
    lines = [
        f"# {label} on the tiny agents: preset `{PRESET}` ({' + '.join(agents)})", "",
        made_by, measured + "Overlap: "
        f"`{' '.join(compare_tiny.ARMS[arm].extra)}`; synchronous HACPO: the `hacpo` arm of "
        "[tiny_model.md](tiny_model.md), the same seeds (same prompt batches). **Final** = mean of the greedy test "
        "accuracies (400 problems) at the last two evaluations; mean ± sample std over seeds.", "",
        "| arm | seeds | " + " | ".join(f"{a} final" for a in agents) + " | wall s / run |",
        "|---|---|" + "---|" * len(agents) + "---|",
        "| before training | | " + " | ".join(fmt(overlap["agents"][a]["acc_before"]) for a in agents) + " | |",
        f"| HACPO, synchronous | {len(sync['seeds'])} | "
        + " | ".join(fmt_pm(sync["agents"][a]["final_mean"], sync["agents"][a]["final_std"]) for a in agents)
        + f" | {fmt(meta.get('sync_wall_seconds'), 0)} |",
        f"| {label} | {len(seeds)} | "
        + " | ".join(fmt_pm(overlap["agents"][a]["final_mean"], overlap["agents"][a]["final_std"]) for a in agents)
        + f" | {fmt(overlap.get('wall_seconds'), 0)} |",
        "", "Per seed (final accuracy; synchronous / one step off):", "",
        "| seed | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents),
    ]
    lines += compare_tiny.per_seed_rows(sync, overlap, seeds, agents)
    lines += ["", "| | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents),
              compare_tiny.paired_row("one step off − synchronous (paired by seed)", overlap, sync, agents),
              "| one-step-off mean against the synchronous mean ± std | "
              + " | ".join(summary[a]["overlap_vs_spread"] for a in agents) + " |",
              "| GSPO ×2's final accuracy (the target) | " + " | ".join(fmt(summary[a]["target"]) for a in agents)
              + " |",
              "| first step the synchronous mean reaches it | "
              + " | ".join(str(summary[a]["sync_step"] or "not reached") for a in agents) + " |",
              "| first step the one-step-off mean reaches it | "
              + " | ".join(str(summary[a]["overlap_step"] or "not reached") for a in agents) + " |"]
    lines += ["", "Mean accuracy over seeds at each evaluation (synchronous / one step off):", "",
              "| step | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents)]
    for i, row in enumerate(overlap["agents"][agents[0]]["curve"]):
        cells = []
        for a in agents:
            sc, oc = sync["agents"][a]["curve"], overlap["agents"][a]["curve"]
            cells.append(f"{fmt(sc[i][1]) if i < len(sc) else '–'} / {fmt(oc[i][1])}")
        lines.append(f"| {int(row[0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--arm", default="hacpo-overlap", choices=ARMS)
    compare_tiny.add_seed_run_options(parser, compare_tiny.DEFAULT_SEEDS["overlap"])
    parser.add_argument("--sync_results", type=Path, default=compare_tiny.RESULTS_DIR / "tiny_model.json",
                        help="the committed report whose hacpo and gspo2x arms are compared with")
    args = parser.parse_args(argv)
    seeds, preset, steps, root = compare_tiny.seed_run_setup(parser, args, PRESET)
    from openrlhf_hacpo.zoo.shipped import agent_folders, agent_records

    stem = f"tiny_model_{args.arm.replace('-', '_')}" + ("" if steps == preset.rl.num_steps else f"_{steps}steps")
    command = "python benchmarks/compare_tiny_overlap.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    arm = compare_tiny.ARMS[args.arm]
    with ResultWriter(stem, args.results_dir, command=command.strip(), name="compare_tiny_overlap") as out:
        folders = agent_folders(preset.agents, progress=True)
        fingerprints = {name: r["fingerprint"] for name, r in agent_records(folders).items()}
        committed = json.loads(args.sync_results.read_text(encoding="utf-8"))
        sync = full_parameter_arm(committed, seeds, steps, fingerprints)
        found, failure = compare_tiny.run_arm_seeds(arm, seeds, preset, steps, root, args.jobs, fingerprints,
                                                    command.strip(), args.report_only)
        if failure:
            out.fail(failure)
            return 1
        overlap = aggregate_arm(found)
        # the synchronous mean curve over the same seeds is only in the committed report for all 5 seeds
        if sorted(seeds) != sorted(int(s) for s in committed["arms"]["hacpo"]["seeds"]):
            raise SystemExit("compare_tiny_overlap: the synchronous curve is the committed 5-seed mean: run every "
                             "seed of the committed hacpo arm")
        for agent, entry in sync["agents"].items():
            entry["curve"] = committed["arms"]["hacpo"]["agents"][agent]["curve"]
        targets = {agent: committed["arms"]["gspo2x"]["agents"][agent]["final_mean"] for agent in sync["agents"]}
        ran = (root / compare_tiny.COMMANDS_FILE).read_text(encoding="utf-8").splitlines() \
            if (root / compare_tiny.COMMANDS_FILE).exists() else []
        commands = [c for c in dict.fromkeys(ran) if f"--arms {args.arm} " in c + " " or f"--arm {args.arm}" in c
                    or (args.arm == "hacpo-overlap" and "compare_tiny_overlap.py" in c and "--arm " not in c)]
        meta = {**compare_tiny.seed_run_meta(arm, preset, steps, root, args.jobs, fingerprints,
                                             list(dict.fromkeys([*commands, command.strip()])), found),
                "sync_wall_seconds": committed["arms"]["hacpo"].get("wall_seconds")}
        summary = summarize(sync, overlap, targets)
        markdown = render(args.arm, sync, overlap, summary, meta)
        out.commit({".json": {"meta": meta, "synchronous": sync, "overlap": overlap, "summary": summary,
                              "paired": paired_differences(overlap, sync)}, ".md": markdown})
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
