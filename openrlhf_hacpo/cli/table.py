"""Print the paper's tables next to the reproduced values, and write them with a plot.

    python -m openrlhf_hacpo.cli.table --results runs/eval                     # Table 1, every results file under it
    python -m openrlhf_hacpo.cli.table --results a.json b.json --tables 1,2,3,7 --output_dir runs/table
    python -m openrlhf_hacpo.cli.table --results runs/eval --verifier boxed_math   # the lenient verifier, apart
    python -m openrlhf_hacpo.cli.table --tables 1                               # the paper's values only

``--output_dir`` receives ``table.md`` and, when any value is reproduced, ``table.png`` (ours against the paper).
The results files are described in :mod:`openrlhf_hacpo.reproduce.results`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.reproduce.results import ResultsError, read_results
from openrlhf_hacpo.reproduce.table import compare, plot_comparison, render_markdown, render_other, unmatched
from openrlhf_hacpo.utils.atomic import atomic_write_text

TABLES = ("1", "2", "3", "7")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.cli.table", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", nargs="*", default=[], type=Path,
                   help="results JSON files, or folders searched for them (default: none, the paper's values only)")
    p.add_argument("--tables", default="1", help=f"comma-separated paper tables among {', '.join(TABLES)}")
    p.add_argument("--verifier", default="boxed_exact",
                   help="show results scored with this verifier (boxed_exact reproduces the paper's reward)")
    p.add_argument("--output_dir", type=Path, default=None, help="write table.md and table.png there")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    unknown = [t for t in tables if t not in TABLES]
    if unknown or not tables:
        print(f"table: error: --tables {args.tables!r}: choose among {', '.join(TABLES)}", file=sys.stderr)
        return 2
    try:
        results = read_results(args.results)
    except ResultsError as err:
        print(f"table: error: {err}", file=sys.stderr)
        return 2
    rows = compare(results, tables, args.verifier)
    text = render_markdown(rows, args.verifier)
    other_results = render_other(unmatched(results, tables, args.verifier))
    if other_results:
        text += "\n" + other_results
    other = sorted({r.verifier for r in results} - {args.verifier})
    if other:
        text += (f"Results scored with {', '.join(other)} are not shown; pass --verifier to see them (they are not "
                 "comparable with the paper's boxed exact-match reward).\n")
    print(text, end="")
    if args.output_dir is not None:
        md = atomic_write_text(args.output_dir / "table.md", text)
        title = f"Table{'s' if len(tables) > 1 else ''} {', '.join(tables)}: reproduced vs paper"
        png = plot_comparison(rows, args.output_dir / "table.png", title)
        print(f"wrote {md}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
