"""Reproduced values next to the paper's: one markdown table per (paper table, setting), and a scatter plot.

A cell reads ``ours / paper (ours − paper)``; ``— / paper`` where no result exists yet. A result fills a cell when
its model, method and benchmark match the paper row, its setting matches (a base-model result with no setting fills
that model's base row in every setting) and its verifier is the one asked for. Several matching results (seeds) are
averaged, and the cell says how many. A result whose metric is not the paper's metric for the column (``mean@1`` for
avg@1, ``best@30`` for AIME25) is marked with ``†``.

AVG is recomputed on both sides as the unweighted mean of the seven columns; ours only when all seven are present.
The paper's printed AVG is shown where it differs from the recomputed one.
"""
from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from openrlhf_hacpo.reproduce.benchmarks import DATASETS
from openrlhf_hacpo.reproduce.paper_tables import COLUMN_SETS, COLUMNS, PaperRow, avg_disagreements, paper_rows
from openrlhf_hacpo.reproduce.results import BenchmarkResult
from openrlhf_hacpo.utils.atomic import atomic_write_bytes

__all__ = ["Cell", "ComparedRow", "compare", "paper_metric", "plot_comparison", "render_markdown", "render_other",
           "unmatched"]

MISSING = "—"


def paper_metric(column: str) -> str:
    """The result metric that reproduces a paper column: ``mean@1`` for avg@1, ``best@30`` for AIME25."""
    metric = DATASETS[COLUMN_SETS[column]].metric
    return "mean@1" if metric == "avg@1" else str(metric)


@dataclass(frozen=True)
class Cell:
    """One column of one row: the paper's value and ours (mean of ``count`` results; None when there is none)."""

    column: str
    paper: float
    ours: float | None
    count: int = 0
    metric_differs: bool = False

    @property
    def delta(self) -> float | None:
        return None if self.ours is None else self.ours - self.paper


@dataclass(frozen=True)
class ComparedRow:
    paper: PaperRow
    cells: tuple[Cell, ...]

    @property
    def ours_avg(self) -> float | None:
        if any(c.ours is None for c in self.cells):
            return None
        return sum(c.ours for c in self.cells) / len(self.cells)


def _matches(result: BenchmarkResult, row: PaperRow, verifier: str) -> bool:
    if result.verifier != verifier or result.model != row.model or result.method != row.method:
        return False
    return result.setting == row.setting or (row.method == "base" and result.setting is None)


def compare(results: Iterable[BenchmarkResult], tables: Sequence[str] = ("1",),
            verifier: str = "boxed_exact") -> list[ComparedRow]:
    """Every paper row of ``tables`` with the results that reproduce it."""
    results = list(results)
    rows = []
    for table in tables:
        for row in paper_rows(table=table):
            by_set: dict[str, list[BenchmarkResult]] = defaultdict(list)
            for r in results:
                if _matches(r, row, verifier):
                    by_set[r.benchmark].append(r)
            cells = []
            for column in COLUMNS:
                found = by_set.get(COLUMN_SETS[column], [])
                ours = sum(r.value for r in found) / len(found) if found else None
                differs = any(r.metric != paper_metric(column) for r in found)
                cells.append(Cell(column, row.value(column), ours, len(found), differs))
            rows.append(ComparedRow(row, tuple(cells)))
    return rows


def unmatched(results: Iterable[BenchmarkResult], tables: Sequence[str] = ("1",),
              verifier: str = "boxed_exact") -> list[BenchmarkResult]:
    """Results of ``verifier`` that fill no cell of ``tables`` (other benchmarks such as ``champ``, other models)."""
    rows = [row for t in tables for row in paper_rows(table=t)]
    paper_sets = set(COLUMN_SETS.values())
    return [r for r in results if r.verifier == verifier
            and not (r.benchmark in paper_sets and any(_matches(r, row, verifier) for row in rows))]


def render_other(results: Sequence[BenchmarkResult]) -> str:
    """Markdown list of results that are not in the paper's tables."""
    if not results:
        return ""
    out = ["### Results outside the paper's tables", "",
           "| run | setting | model | method | benchmark | metric | value | n | prompts |", "|---" * 9 + "|"]
    for r in results:
        out.append(f"| {r.run} | {r.setting or MISSING} | {r.model} | {r.method} | {r.benchmark} | {r.metric} | "
                   f"{r.value:.3f} | {r.n} | {r.num_prompts} |")
    return "\n".join(out) + "\n"


def _cell_text(ours: float | None, paper: float, count: int = 0, metric_differs: bool = False) -> str:
    if ours is None:
        return f"{MISSING} / {paper:.3f}"
    mark = ("†" if metric_differs else "") + (f" ×{count}" if count > 1 else "")
    return f"{ours:.3f}{mark} / {paper:.3f} ({ours - paper:+.3f})"


def render_markdown(rows: Sequence[ComparedRow], verifier: str = "boxed_exact") -> str:
    """Markdown: a heading and a table per (paper table, setting), then notes."""
    out: list[str] = []
    groups: dict[tuple[str, str], list[ComparedRow]] = {}
    for r in rows:
        groups.setdefault((r.paper.table, r.paper.setting), []).append(r)
    printed_off = {id(r): d for r, d in avg_disagreements()}
    any_differs = False
    for (table, setting), group in groups.items():
        out.append(f"### Table {table}: {setting} (ours / paper (Δ), verifier {verifier})")
        out.append("")
        out.append("| model | method | " + " | ".join(COLUMNS) + " | AVG |")
        out.append("|---|---|" + "---|" * (len(COLUMNS) + 1))
        for r in group:
            cells = [_cell_text(c.ours, c.paper, c.count, c.metric_differs) for c in r.cells]
            any_differs |= any(c.metric_differs for c in r.cells)
            avg = _cell_text(r.ours_avg, r.paper.avg)
            if id(r.paper) in printed_off:
                avg += f" [printed {r.paper.printed_avg:.3f}]"
            out.append(f"| {r.paper.model} | {r.paper.method} | " + " | ".join(cells) + f" | {avg} |")
        out.append("")
    filled = sum(1 for r in rows for c in r.cells if c.ours is not None)
    total = sum(len(r.cells) for r in rows)
    out.append(f"{filled} of {total} cells reproduced. Metrics: avg@1 = greedy mean@1; AIME25 = verl's bootstrap "
               "best@30. AVG = unweighted mean of the 7 columns, recomputed on both sides.")
    if any_differs:
        out.append("† the result's metric is not the paper's metric for this column.")
    return "\n".join(out) + "\n"


def plot_comparison(rows: Sequence[ComparedRow], path: str | Path, title: str = "") -> Path | None:
    """Scatter of ours (y) against the paper (x) for every reproduced cell, one colour per method, with y = x.

    Returns None (and writes nothing) when no cell is reproduced.
    """
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        for c in r.cells:
            if c.ours is not None:
                points[r.paper.method].append((c.paper, c.ours))
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="ours = paper")
    for method, pts in points.items():
        xs, ys = zip(*pts)
        ax.scatter(xs, ys, s=18, label=f"{method} ({len(pts)})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("paper")
    ax.set_ylabel("reproduced")
    ax.set_title(title or "reproduced vs paper, one point per benchmark cell")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
