"""HACPO with LoRA adapters on both tiny agents, beside full-parameter HACPO: the same preset, seeds and prompts.

    python benchmarks/compare_tiny_lora.py                  # the lora arm, seeds 0,1,2, 80 steps, 2 runs at a time
    python benchmarks/compare_tiny_lora.py --report_only    # the table again from the runs on disk

The LoRA runs are the ``lora`` arm of ``benchmarks/compare_tiny.py`` (its runs folder, commands and checks; rank,
α and learning rate in :data:`compare_tiny.LORA_RANK` and next to it). The full-parameter side is not run again: it
is the ``hacpo`` arm of the committed ``benchmarks/results/tiny_model.json`` (5 seeds, the same shipped agents, checked
by their weights' fingerprints), paired with the LoRA runs by seed (same seed, same prompt batches). The report gives
each agent's final greedy test accuracy (mean of the last two evaluations) before training, with full-parameter
HACPO and with LoRA, per seed, the paired differences, whether LoRA improved every seed over the agent before
training, the trainable parameters and the mean seconds per step and per update.

Writes ``benchmarks/results/tiny_model_lora.{md,json}`` through :class:`results_io.ResultWriter` (only when every
run succeeded; else ``tiny_model_lora.failed.md``).
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
from results_io import ResultWriter  # noqa: E402

from openrlhf_hacpo.zoo.reports import aggregate_arm, fmt, fmt_pm, paired_differences  # noqa: E402

STEM = "tiny_model_lora"
PRESET = "model"
DEFAULT_SEEDS = compare_tiny.DEFAULT_SEEDS["lora"]


def full_parameter_arm(results: Mapping[str, Any], seeds: Sequence[int], steps: int,
                       fingerprints: Mapping[str, str]) -> dict[str, Any]:
    """The ``hacpo`` arm of a committed ``tiny_model.json`` restricted to ``seeds``; ``ValueError`` when that report
    was made with other agents, another step count or lacks a seed."""
    meta, arm = results["meta"], results["arms"].get("hacpo")
    if arm is None:
        raise ValueError("the full-parameter report has no 'hacpo' arm")
    made_with = {name: r["fingerprint"] for name, r in (meta.get("agent_fingerprints") or {}).items()}
    if made_with != dict(fingerprints):
        raise ValueError(f"the full-parameter report trained other agents (fingerprints {made_with}, now "
                         f"{dict(fingerprints)})")
    if meta.get("steps") != steps:
        raise ValueError(f"the full-parameter report ran {meta.get('steps')} steps, the LoRA runs {steps}")
    agents = {}
    for name, entry in arm["agents"].items():
        missing = [s for s in seeds if str(s) not in entry["final_by_seed"]]
        if missing:
            raise ValueError(f"the full-parameter report has no seed {missing} for {name}")
        finals = {str(s): entry["final_by_seed"][str(s)] for s in seeds}
        mean, std = _mean_std(list(finals.values()))
        agents[name] = {**entry, "final_by_seed": finals, "final_mean": mean, "final_std": std}
    return {"seeds": list(seeds), "agents": agents, "settings": arm.get("settings")}


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    from openrlhf_hacpo.zoo.reports import mean_std

    return mean_std(values)


def trainable_parameters(folders: Mapping[str, Path], rank: int) -> dict[str, tuple[int, int]]:
    """(all parameters, LoRA parameters at ``rank`` on every linear layer) of each agent, from its ``config.json``
    (the memory plan's count, tested equal to peft's)."""
    from transformers import AutoConfig

    from openrlhf_hacpo.trainer.memory_sizes import ModelShape

    out = {}
    for name, folder in folders.items():
        shape = ModelShape.from_config(AutoConfig.from_pretrained(folder), f"agent {name!r}")
        out[name] = (shape.parameters(), shape.lora_parameters(rank, "all-linear"))
    return out


def render(full: Mapping[str, Any], lora: Mapping[str, Any], params: Mapping[str, tuple[int, int]],
           meta: Mapping[str, Any]) -> str:
    """The markdown report (see the module's docstring)."""
    agents = list(meta["agents"])
    seeds = [int(s) for s in lora["seeds"]]
    label = compare_tiny.ARMS["lora"].label
    made_by, measured = compare_tiny.provenance_lines(meta)
    lines = [
        f"# HACPO with LoRA on the tiny agents: preset `{PRESET}` ({' + '.join(agents)})", "",
        made_by, measured + "LoRA: "
        f"`{' '.join(compare_tiny.ARMS['lora'].extra)}` on every linear layer of the decoder blocks of both agents "
        "(embeddings, norms and the tied head frozen); full-parameter HACPO: the `hacpo` arm of "
        "[tiny_model.md](tiny_model.md), the same seeds (same prompt batches). **Final** = mean of the greedy test "
        "accuracies (400 problems) at the last two evaluations; mean ± sample std over seeds.", "",
        "| arm | seeds | trainable parameters | " + " | ".join(f"{a} final" for a in agents) + " |",
        "|---|---|---|" + "---|" * len(agents),
        "| before training | | – | " + " | ".join(fmt(lora["agents"][a]["acc_before"]) for a in agents) + " |",
        f"| HACPO, full-parameter | {len(full['seeds'])} | "
        + ", ".join(f"{a} {params[a][0]:,}" for a in agents) + " | "
        + " | ".join(fmt_pm(full["agents"][a]["final_mean"], full["agents"][a]["final_std"]) for a in agents) + " |",
        f"| {label} | {len(seeds)} | " + ", ".join(f"{a} {params[a][1]:,}" for a in agents) + " | "
        + " | ".join(fmt_pm(lora["agents"][a]["final_mean"], lora["agents"][a]["final_std"]) for a in agents) + " |",
        "", "Per seed (final accuracy; full-parameter / LoRA):", "",
        "| seed | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents),
    ]
    lines += compare_tiny.per_seed_rows(full, lora, seeds, agents)
    lines += ["", "| comparison | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents),
              compare_tiny.paired_row("LoRA − full-parameter (paired by seed)", lora, full, agents),
              "| LoRA − before training | " + " | ".join(
                  f"{fmt(lora['agents'][a]['final_mean'] - lora['agents'][a]['acc_before'], signed=True)} "
                  f"({improved(lora, a)}/{len(seeds)} seeds above)" for a in agents) + " |"]
    lines += ["", "Mean seconds per step of an agent's run (the agents work concurrently; shared machine):", "",
              "| arm | agent | step s | update s |", "|---|---|---|---|"]
    for arm_label, arm in (("HACPO, full-parameter", full), (label, lora)):
        for a in agents:
            sec = arm["agents"][a].get("seconds") or {}
            lines.append(f"| {arm_label} | {a} | {fmt(sec.get('step'), 2)} | {fmt(sec.get('update'), 2)} |")
    return "\n".join(lines) + "\n"


def improved(arm: Mapping[str, Any], agent: str) -> int:
    """Seeds whose final accuracy is above the agent's accuracy before training."""
    entry = arm["agents"][agent]
    return sum(v > entry["acc_before"] for v in entry["final_by_seed"].values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    compare_tiny.add_seed_run_options(parser, DEFAULT_SEEDS)
    parser.add_argument("--full_results", type=Path, default=compare_tiny.RESULTS_DIR / "tiny_model.json",
                        help="the committed full-parameter report whose hacpo arm is compared with")
    args = parser.parse_args(argv)
    seeds, preset, steps, root = compare_tiny.seed_run_setup(parser, args, PRESET)
    from openrlhf_hacpo.zoo.shipped import agent_folders, agent_records

    stem = STEM if steps == preset.rl.num_steps else f"{STEM}_{steps}steps"
    command = "python benchmarks/compare_tiny_lora.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    arm = compare_tiny.ARMS["lora"]
    with ResultWriter(stem, args.results_dir, command=command.strip(), name="compare_tiny_lora") as out:
        folders = agent_folders(preset.agents, progress=True)
        fingerprints = {name: r["fingerprint"] for name, r in agent_records(folders).items()}
        full = full_parameter_arm(json.loads(args.full_results.read_text(encoding="utf-8")), seeds, steps,
                                  fingerprints)
        found, failure = compare_tiny.run_arm_seeds(arm, seeds, preset, steps, root, args.jobs, fingerprints,
                                                    command.strip(), args.report_only)
        if failure:
            out.fail(failure)
            return 1
        lora = aggregate_arm(found)
        meta = compare_tiny.seed_run_meta(arm, preset, steps, root, args.jobs, fingerprints, [command.strip()], found)
        params = trainable_parameters(folders, compare_tiny.LORA_RANK)
        markdown = render(full, lora, params, meta)
        out.commit({".json": {"meta": meta, "full_parameter": full, "lora": lora,
                              "parameters": {a: {"all": p, "lora": q} for a, (p, q) in params.items()},
                              "paired": paired_differences(lora, full)}, ".md": markdown})
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
