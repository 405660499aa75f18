"""The step timeline model (openrlhf_hacpo/trainer/timeline.py) against measured steps, and its one-step-off forecast.

    python benchmarks/throughput.py --config model --arms gspo,hacpo     # measured runs (or any earlier ones)
    python benchmarks/timeline_check.py runs/throughput/model             # this table

For every run folder under the given root (``<arm>/round<r>/metrics.jsonl``, as benchmarks/throughput.py leaves
them) and every step after the warm-up, the step's own per-agent phase costs (``time/generate``, ``time/scoring``,
the learner's phases, ``time/sync``, the driver's reward and capability) go into the model, and the predicted
synchronous step is set beside the measured ``time/step``. Per arm it prints the medians over the measured steps:
measured step, predicted step and their relative difference, the two phases' overheads the costs leave out (the
measured rollout phase less max_k (g_k + s_k), the train phase less max_k l_k: the driver's calls, transfers and
bookkeeping), and the forecast of the one-step-off step on resources of its own and on ``--cores`` shared cores:
the model's one-step-off step plus the step's whole residual (measured less predicted synchronous step, assumed
paid in full, none of it hidden by the overlap), with the gain measured step / forecast.
"""
from __future__ import annotations

import argparse
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
    one_step_off_step,
    phases_from_records,
    synchronous_step,
)


def step_check(records: Sequence[Mapping[str, Any]], cores: int) -> dict[str, float]:
    """One step's measured and predicted seconds from its per-agent records (agent order as logged)."""
    phases = phases_from_records(records)
    first = records[0]
    rollout_costs = max(a.generate + a.scoring for a in phases.agents)
    learn_costs = max(a.learn for a in phases.agents)
    measured = float(first["time/step"])
    synchronous = synchronous_step(phases)
    residual = measured - synchronous
    off_own = one_step_off_step(phases) + residual
    off_shared = one_step_off_step(phases, Resources.shared(cores)) + residual
    return {
        "measured": measured,
        "predicted": synchronous,
        "rollout_overhead": float(first["time/rollout_phase"]) - rollout_costs,
        "train_overhead": float(first["time/train_phase"]) - learn_costs,
        "off_own": off_own,
        "off_shared": off_shared,
        "gain_own": measured / off_own,
        "gain_shared": measured / off_shared,
    }


def arm_checks(root: Path, warmup: int, cores: int) -> dict[str, list[dict[str, float]]]:
    """Per arm folder under ``root``: the checks of every measured step of every round."""
    out: dict[str, list[dict[str, float]]] = {}
    for metrics in sorted(root.glob("*/round*/metrics.jsonl")):
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        steps = steps_of(records, warmup)
        out.setdefault(metrics.parent.parent.name, []).extend(step_check(recs, cores) for recs in steps.values())
    if not out:
        raise FileNotFoundError(f"no <arm>/round<r>/metrics.jsonl under {root}: run benchmarks/throughput.py first")
    return out


def format_table(checks: Mapping[str, Sequence[Mapping[str, float]]], cores: int) -> str:
    lines = [f"| arm | steps | measured step s | predicted s | predicted / measured − 1 | rollout overhead s | "
             f"train overhead s | one step off, own cores s | gain | one step off, {cores} shared cores s | gain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, rows in checks.items():
        m = {key: median([row[key] for row in rows]) for key in rows[0]}
        lines.append(f"| {arm} | {len(rows)} | {m['measured']:.3f} | {m['predicted']:.3f} | "
                     f"{m['predicted'] / m['measured'] - 1:+.1%} | {m['rollout_overhead']:.3f} | "
                     f"{m['train_overhead']:.3f} | {m['off_own']:.3f} | {m['gain_own']:.2f}× | "
                     f"{m['off_shared']:.3f} | {m['gain_shared']:.2f}× |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, help="a benchmarks/throughput.py run folder (<arm>/round<r>/metrics.jsonl)")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out [2]")
    p.add_argument("--cores", type=int, default=2, help="cores shared by every process in the shared forecast [2]")
    args = p.parse_args(argv)
    print(format_table(arm_checks(args.runs, args.warmup, args.cores), args.cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
