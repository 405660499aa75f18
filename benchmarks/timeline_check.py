"""The step timeline model (openrlhf_hacpo/trainer/timeline.py) against measured steps, and its one-step-off forecast
against measured one-step-off steps.

    python benchmarks/throughput.py --config model --arms gspo,hacpo     # measured runs (or any earlier ones)
    python benchmarks/timeline_check.py runs/throughput/model             # these tables

For every synchronous run folder under the given root (``<arm>/round<r>/metrics.jsonl``, as benchmarks/throughput.py
leaves them) and every step after the warm-up, the step's own per-agent phase costs (``time/generate``,
``time/scoring``, the learner's phases, ``time/sync``, the driver's reward and capability) go into the model and the
predicted synchronous step is set beside the measured ``time/step``, twice: from the costs alone, and with the two
phases' dispatch (``collect``: the measured rollout phase less max_k (g_k + s_k); ``dispatch``: the train phase less
max_k l_k), each the median over the arm's *other* measured steps, so that no step's prediction reads its own
length. Per arm it prints the medians over the measured steps.

The one-step-off forecast takes the same costs and the arm's median dispatch, on resources of its own and on
``--cores`` shared cores. Where the root also holds the arm's one-step-off run (``<arm>-overlap``, as
``--arms gspo,hacpo,gspo-overlap,hacpo-overlap -- --rollout_backend hf_engine`` leaves them), its measured median
step (warm-up and last step dropped: the last generates nothing) is set beside the forecast: a check of the
schedule the model forecasts from synchronous measurements only. A third table sets, per agent, the medians of
the synchronous and the one-step-off run side by side: the engines' own generation time (``time/engine_generate``),
the scoring pass, the update, and the driver's train phase, its wait for the rollouts after it, the sync and the step.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, _p)

from throughput_stats import median, steps_of  # noqa: E402

from openrlhf_hacpo.trainer.timeline import (  # noqa: E402
    Resources,
    dispatch_from_records,
    one_step_off_step,
    phases_from_records,
    synchronous_step,
)

OVERLAP = "-overlap"
"""The suffix of a one-step-off arm's folder (benchmarks/throughput.py's arm names)."""


def step_check(records: Sequence[Mapping[str, Any]], cores: int, collect: float,
               dispatch: float) -> dict[str, float]:
    """One synchronous step's measured and predicted seconds from its per-agent records (agent order as logged);
    ``collect`` and ``dispatch``: the phases' dispatch to predict it with (measured on other steps)."""
    costs = phases_from_records(records)
    phases = dataclasses.replace(costs, collect=collect, dispatch=dispatch)
    measured = float(records[0]["time/step"])
    return {
        "measured": measured,
        "costs_only": synchronous_step(costs),
        "predicted": synchronous_step(phases),
        "collect": collect,
        "dispatch": dispatch,
        "off_own": one_step_off_step(phases),
        "off_shared": one_step_off_step(phases, Resources.shared(cores)),
    }


def _runs(root: Path, warmup: int) -> dict[str, list[list[Mapping[str, Any]]]]:
    """Per arm folder under ``root``: the records of every measured step of every round (a one-step-off arm's last
    step of each round left out)."""
    out: dict[str, list[list[Mapping[str, Any]]]] = {}
    for metrics in sorted(root.glob("*/round*/metrics.jsonl")):
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        arm = metrics.parent.parent.name
        steps = list(steps_of(records, warmup).values())
        if arm.endswith(OVERLAP):
            steps = steps[:-1]
        out.setdefault(arm, []).extend(steps)
    if not out:
        raise FileNotFoundError(f"no <arm>/round<r>/metrics.jsonl under {root}: run benchmarks/throughput.py first")
    return out


def arm_checks(root: Path, warmup: int, cores: int) -> dict[str, list[dict[str, float]]]:
    """Per synchronous arm folder under ``root``: the checks of every measured step of every round, each predicted
    with the median dispatch of the arm's other steps."""
    out: dict[str, list[dict[str, float]]] = {}
    for arm, steps in _runs(root, warmup).items():
        if arm.endswith(OVERLAP):
            continue
        measured = [dispatch_from_records(recs) for recs in steps]
        if len(steps) < 2:
            raise ValueError(f"arm {arm!r} has {len(steps)} measured step(s): the dispatch of a step is taken from "
                             "the others, so give --steps >= warmup + 2")
        checks = []
        for i, recs in enumerate(steps):
            others = measured[:i] + measured[i + 1:]
            checks.append(step_check(recs, cores, median([c for c, _ in others]), median([e for _, e in others])))
        out[arm] = checks
    return out


def overlap_steps(root: Path, warmup: int) -> dict[str, list[float]]:
    """Per one-step-off arm under ``root`` (named by its synchronous arm): its measured steps' seconds."""
    return {arm[:-len(OVERLAP)]: [float(recs[0]["time/step"]) for recs in steps]
            for arm, steps in _runs(root, warmup).items() if arm.endswith(OVERLAP)}


SHIFT_KEYS = ("time/engine_generate", "time/scoring", "time/update", "time/train_phase", "time/rollout_phase",
              "time/sync", "time/step")
"""What :func:`phase_shift` sets side by side: per agent, the engines' own generation time, the scoring pass and the
update; the driver's train phase, its wait for the rollouts after it (``rollout_phase``), the sync and the step."""


def phase_shift(root: Path, warmup: int) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """Per arm with both runs under ``root``, per agent, per key of :data:`SHIFT_KEYS`: the median over the measured
    steps of the synchronous run and of the one-step-off run (records without the key count as absent)."""
    runs = _runs(root, warmup)
    out: dict[str, dict[str, dict[str, tuple[float, float]]]] = {}
    for arm, steps in runs.items():
        off = runs.get(arm + OVERLAP)
        if arm.endswith(OVERLAP) or not off:
            continue
        out[arm] = {}
        for agent in [r["agent"] for r in steps[0]]:
            row = {}
            for key in SHIFT_KEYS:
                sync, overlapped = _values(steps, agent, key), _values(off, agent, key)
                if sync and overlapped:
                    row[key] = (median(sync), median(overlapped))
            out[arm][agent] = row
    return out


def _values(steps: Sequence[Sequence[Mapping[str, Any]]], agent: str, key: str) -> list[float] | None:
    """``key`` of ``agent``'s record in every step; None when a step's record lacks it."""
    values = [float(r[key]) for recs in steps for r in recs if r["agent"] == agent and key in r]
    return values if len(values) == len(steps) else None


def format_shift(shift: Mapping[str, Mapping[str, Mapping[str, tuple[float, float]]]]) -> str:
    """Markdown: each key's synchronous and one-step-off medians and their ratio, per arm and agent."""
    keys = [k for k in SHIFT_KEYS if any(k in row for agents in shift.values() for row in agents.values())]
    lines = ["| arm | agent | " + " | ".join(f"{k.removeprefix('time/')} s: sync → off (×)" for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for arm, agents in shift.items():
        for agent, row in agents.items():
            cells = [f"{row[k][0]:.3f} → {row[k][1]:.3f} ({row[k][1] / row[k][0]:.2f}×)" if k in row and row[k][0]
                     else "–" for k in keys]
            lines.append(f"| {arm} | {agent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_tables(checks: Mapping[str, Sequence[Mapping[str, float]]], overlap: Mapping[str, Sequence[float]],
                  cores: int) -> str:
    lines = ["| arm | steps | measured step s | costs only s | costs only / measured − 1 | collect s | dispatch s | "
             "predicted s | predicted / measured − 1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    medians = {}
    for arm, rows in checks.items():
        m = medians[arm] = {key: median([row[key] for row in rows]) for key in rows[0]}
        lines.append(f"| {arm} | {len(rows)} | {m['measured']:.3f} | {m['costs_only']:.3f} | "
                     f"{m['costs_only'] / m['measured'] - 1:+.1%} | {m['collect']:.3f} | {m['dispatch']:.3f} | "
                     f"{m['predicted']:.3f} | {m['predicted'] / m['measured'] - 1:+.1%} |")
    lines += ["", f"| arm | one step off, own cores s | gain | one step off, {cores} shared cores s | gain | "
                  "measured one step off s | steps | forecast / measured − 1 |",
              "|---|---|---|---|---|---|---|---|"]
    for arm, m in medians.items():
        measured = overlap.get(arm)
        tail = (f"{median(measured):.3f} | {len(measured)} | {m['off_shared'] / median(measured) - 1:+.1%}"
                if measured else "– | – | –")
        lines.append(f"| {arm} | {m['off_own']:.3f} | {m['measured'] / m['off_own']:.2f}× | {m['off_shared']:.3f} | "
                     f"{m['measured'] / m['off_shared']:.2f}× | {tail} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, help="a benchmarks/throughput.py run folder (<arm>/round<r>/metrics.jsonl)")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out [2]")
    p.add_argument("--cores", type=int, default=2, help="cores shared by every process in the shared forecast [2]")
    args = p.parse_args(argv)
    print(format_tables(arm_checks(args.runs, args.warmup, args.cores), overlap_steps(args.runs, args.warmup),
                        args.cores))
    shift = phase_shift(args.runs, args.warmup)
    if shift:
        print("\nWhere the time goes, synchronous against one step off (medians over the measured steps):\n")
        print(format_shift(shift))
    return 0


if __name__ == "__main__":
    sys.exit(main())
