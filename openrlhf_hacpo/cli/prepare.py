"""Prepare the reproduction's prompt files: the MATH training set and the seven benchmarks (or the CHAMP set).

    python -m openrlhf_hacpo.cli.prepare                                   # the paper's 8 sets from the hub
    python -m openrlhf_hacpo.cli.prepare --source_dir /data/hf_copies      # the same, offline, from local copies
    python -m openrlhf_hacpo.cli.prepare --sets champ                      # the offline CHAMP set (wheel)
    python -m openrlhf_hacpo.cli.prepare --override aime25.hub_id=yentinglin/aime_2025 --sets aime25
    python -m openrlhf_hacpo.cli.prepare --list                            # the sets and their settings

Writes ``<output_dir>/<set>.jsonl`` and ``<output_dir>/manifest.json`` (rows, sha256, source id, config, split,
label rule per set). See :mod:`openrlhf_hacpo.reproduce.prepare` and ``docs/reproduce.md``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.reproduce.benchmarks import BENCHMARKS, DATASETS, TRAIN_SET, dataset_spec
from openrlhf_hacpo.reproduce.prepare import PrepareConfig, PrepareError, apply_overrides, default_data_dir, prepare

PAPER_SETS = (TRAIN_SET.name, *(b.name for b in BENCHMARKS))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.cli.prepare", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", type=Path, default=None,
                   help="folder for <set>.jsonl and manifest.json (default: $HACPO_CACHE_DIR/reproduce/data, "
                        "else .cache/reproduce/data)")
    p.add_argument("--sets", default=",".join(PAPER_SETS),
                   help=f"comma-separated sets, 'paper' for {','.join(PAPER_SETS)}, 'benchmarks' for the 7 "
                        f"benchmarks (known: {', '.join(DATASETS)})")
    p.add_argument("--source_dir", type=Path, default=None,
                   help="read SOURCE_DIR/<hub id>/ (a local copy laid out like the hub set) instead of the hub")
    p.add_argument("--allow_row_count_mismatch", action="store_true",
                   help="write a set whose row count differs from the protocol's (recorded in the manifest)")
    p.add_argument("--override", action="append", default=[], metavar="SET.FIELD=VALUE",
                   help="change a setting of a set: hub_id, config, split, question_field, answer_field, "
                        "label_rule, expected_rows, context_field (repeatable)")
    p.add_argument("--hub_timeout_s", type=float, default=5.0, help="connection probe timeout for the hub")
    p.add_argument("--list", action="store_true", help="print the sets and their settings, then exit")
    return p


def _set_names(text: str) -> list[str]:
    names: list[str] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        expanded = {"paper": PAPER_SETS, "benchmarks": tuple(b.name for b in BENCHMARKS)}.get(item, (item,))
        names.extend(n for n in expanded if n not in names)
    if not names:
        raise ValueError("--sets names no set")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        specs = tuple(apply_overrides(dataset_spec(n), args.override) for n in _set_names(args.sets))
        if args.list:
            for s in specs:
                print(f"{s.name:14s} {s.hub_id} (config {s.config}, split {s.split}) question={s.question_field} "
                      f"answer={s.answer_field} rule={s.label_rule.value} rows={s.expected_rows} "
                      f"[{s.provenance.value}]")
            return 0
        config = PrepareConfig(output_dir=args.output_dir or default_data_dir(), sets=specs,
                               source_dir=args.source_dir, allow_row_count_mismatch=args.allow_row_count_mismatch,
                               hub_timeout_s=args.hub_timeout_s)
        prepare(config)
    except (PrepareError, ValueError) as err:
        print(f"prepare: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
