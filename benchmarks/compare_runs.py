"""Compare two runs' ``metrics.jsonl``: are the training values the same, and did any phase get slower?

A refactor of the step must not change what it computes. This prints, for two run folders (or two
``metrics.jsonl`` files):

* the largest relative difference of every non-timing value (rewards, losses, ratios, clip fractions, capability,
  token counts), record by record (step, agent), and the keys present in only one run;
* the per-phase seconds (``time/*``) and throughput (``rollout/tokens_per_s``) of each run, as the mean over the
  records, and their ratio new / old.

    python benchmarks/compare_runs.py OLD_RUN NEW_RUN [--rtol 1e-6] [--ignore KEY ...] [--shared_only]

``--ignore`` leaves out keys whose definition changed on purpose (name each, and why, where the result is reported);
``--shared_only`` compares the keys both runs log (a newer trainer logs more ``perf/*`` keys) and counts the rest.

Exit status 1 when a non-timing value differs by more than ``--rtol`` (relative, with ``--atol`` for values near
zero) or the runs hold different records; timing never fails the comparison (machines are noisy: compare ratios
measured back to back).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from openrlhf_hacpo.utils.jsonl import read_jsonl  # noqa: E402

TIMING_PREFIXES = ("time/",)
TIMING_KEYS = {"rollout/tokens_per_s"}


def is_timing(key: str) -> bool:
    return key.startswith(TIMING_PREFIXES) or key in TIMING_KEYS


def load(path: str) -> dict[tuple, dict]:
    """Records keyed by (step, agent), with nested dicts flattened to ``a/b`` keys."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        raise SystemExit(f"compare_runs: {p} does not exist")
    records = {}
    try:
        lines = read_jsonl(p, skip_torn_tail=True)
    except ValueError as exc:
        raise SystemExit(f"compare_runs: {exc}") from None
    for rec in lines:
        flat = {}

        def walk(d, prefix=""):
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}/")
                else:
                    flat[f"{prefix}{k}"] = v

        walk(rec)
        records[(flat.get("step"), flat.get("agent"))] = flat
    return records


def compare(old: dict, new: dict, rtol: float, atol: float, ignore: frozenset = frozenset(),
            shared_only: bool = False) -> tuple[list[str], float, int]:
    """Problems found, the largest relative difference of any non-timing number and how many numbers were compared
    (keys in ``ignore`` are left out; with ``shared_only`` a key only one run logs is not a problem)."""
    problems, worst, compared = [], 0.0, 0
    if old.keys() != new.keys():
        problems.append(f"records differ: only old {sorted(old.keys() - new.keys(), key=str)}, "
                        f"only new {sorted(new.keys() - old.keys(), key=str)}")
    for key in sorted(old.keys() & new.keys(), key=str):
        a, b = old[key], new[key]
        for name in sorted((a.keys() | b.keys())):
            if is_timing(name) or name in ignore:
                continue
            if name not in a or name not in b:
                if not shared_only:
                    problems.append(f"{key}: {name} only in {'new' if name in b else 'old'}")
                continue
            x, y = a[name], b[name]
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
                if math.isnan(x) and math.isnan(y):
                    continue
                compared += 1
                diff = abs(x - y)
                rel = diff / max(abs(x), abs(y), 1e-300)
                worst = max(worst, rel if diff > atol else 0.0)
                if diff > atol + rtol * max(abs(x), abs(y)):
                    problems.append(f"{key}: {name} {x!r} -> {y!r}")
            elif x != y:
                problems.append(f"{key}: {name} {x!r} -> {y!r}")
    return problems, worst, compared


def timing_table(old: dict, new: dict) -> list[str]:
    names = sorted({k for rec in (*old.values(), *new.values()) for k in rec if is_timing(k)})
    lines = ["| value | old (mean) | new (mean) | new / old |", "|---|---:|---:|---:|"]
    for name in names:
        xs = [r[name] for r in old.values() if isinstance(r.get(name), (int, float))]
        ys = [r[name] for r in new.values() if isinstance(r.get(name), (int, float))]
        if not xs or not ys:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        ratio = f"{my / mx:.2f}" if mx else "-"
        lines.append(f"| {name} | {mx:.3f} | {my:.3f} | {ratio} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="run folder or metrics.jsonl")
    parser.add_argument("new", help="run folder or metrics.jsonl")
    parser.add_argument("--rtol", type=float, default=1e-6, help="relative tolerance of non-timing values")
    parser.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance of non-timing values")
    parser.add_argument("--ignore", nargs="+", default=[], metavar="KEY",
                        help="keys left out of the comparison (e.g. a metric whose definition changed on purpose)")
    parser.add_argument("--shared_only", action="store_true",
                        help="compare only the keys both runs log (a key only one run logs is not a difference)")
    args = parser.parse_args(argv)
    old, new = load(args.old), load(args.new)
    problems, worst, compared = compare(old, new, args.rtol, args.atol, frozenset(args.ignore), args.shared_only)
    left_out = f"; left out: {', '.join(args.ignore)}" if args.ignore else ""
    print(f"{len(old)} / {len(new)} records (step, agent), {compared} non-timing numbers compared{left_out}; "
          f"largest relative difference: {worst:.3g} (rtol {args.rtol:g}, atol {args.atol:g})")
    for p in problems[:40]:
        print("  DIFF", p)
    if len(problems) > 40:
        print(f"  ... and {len(problems) - 40} more")
    print()
    print("\n".join(timing_table(old, new)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
