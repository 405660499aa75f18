"""The reproduction's results JSON: one entry per (run, agent, benchmark), written by evaluation, read by the table.

A results file is a JSON object::

    {"schema": "hacpo-reproduce-results/1",
     "results": [
       {"run": "runs/size-hacpo",              # free text: where the numbers come from
        "setting": "qwen3-1.7b-base+qwen3-4b-base",   # the pair (paper_tables.SETTINGS); null for a base model
        "method": "HACPO",                     # paper_tables.METHODS: base, GRPO, GSPO, GSPOx2, Naive, HACPO, ...
        "model": "Qwen3-1.7B-Base",            # the agent, named as in paper_tables
        "benchmark": "aime25",                 # the prepared set (= data_source)
        "metric": "best@30",                   # the metric of ``value``: mean@1 (the paper's avg@1) or best@30
        "value": 0.22,
        "n": 30,                               # samples per prompt
        "num_prompts": 30,
        "verifier": "boxed_exact",             # boxed_exact reproduces the paper; boxed_math is reported apart
        "metrics": {"mean@30": 0.07, "best@30": 0.22, "best@30/expected": 0.221, "pass@30": 0.3},
        "settings": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8196, "seed": 0,
                     "assumptions": ["AIME sampling T=1.0, top-p 1.0: not stated by the paper"]}},
       ...]}

``metrics`` and ``settings`` are free-form (numbers and strings); everything else is checked on reading, and an
error names the file, the entry and the field. A base-model entry (``method`` ``base``) with ``setting`` null is
shown in every setting where that model appears.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from openrlhf_hacpo.reproduce.metrics import BenchmarkMetrics
from openrlhf_hacpo.reproduce.paper_tables import METHODS
from openrlhf_hacpo.utils.atomic import atomic_write_json

__all__ = ["RESULTS_SCHEMA", "BenchmarkResult", "ResultsError", "read_results", "write_results"]

RESULTS_SCHEMA = "hacpo-reproduce-results/1"


class ResultsError(ValueError):
    """A results file or entry is malformed; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class BenchmarkResult:
    """One agent's score on one benchmark (see the module docstring for the fields)."""

    run: str
    setting: str | None
    method: str
    model: str
    benchmark: str
    metric: str
    value: float
    n: int
    num_prompts: int
    verifier: str = "boxed_exact"
    metrics: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ResultsError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if not isinstance(self.value, (int, float)) or isinstance(self.value, bool) or not math.isfinite(self.value):
            raise ResultsError(f"value must be a finite number, got {self.value!r}")
        for name in ("n", "num_prompts"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ResultsError(f"{name} must be a positive integer, got {v!r}")
        for name in ("run", "model", "benchmark", "metric", "verifier"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ResultsError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.setting is not None and (not isinstance(self.setting, str) or not self.setting):
            raise ResultsError(f"setting must be a non-empty string or null, got {self.setting!r}")

    @classmethod
    def from_metrics(cls, metrics: BenchmarkMetrics, *, run: str, setting: str | None, method: str, model: str,
                     verifier: str = "boxed_exact", settings: dict[str, Any] | None = None,
                     metric: str | None = None) -> "BenchmarkResult":
        """An entry from :class:`~openrlhf_hacpo.reproduce.metrics.BenchmarkMetrics`.

        ``metric`` defaults to the paper's choice: ``best@k`` with several samples per prompt, else ``mean@1``.
        """
        named = metrics.named()
        metric = metric or (f"best@{metrics.k}" if metrics.num_samples > 1 else f"mean@{metrics.num_samples}")
        if metric not in named:
            raise ResultsError(f"benchmark {metrics.data_source!r} has no metric {metric!r} (has {sorted(named)})")
        return cls(run=run, setting=setting, method=method, model=model, benchmark=metrics.data_source,
                   metric=metric, value=named[metric], n=metrics.num_samples, num_prompts=metrics.num_prompts,
                   verifier=verifier, metrics=named, settings=dict(settings or {}))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_results(path: str | Path, results: Iterable[BenchmarkResult]) -> Path:
    """Write a results file atomically."""
    return atomic_write_json(path, {"schema": RESULTS_SCHEMA, "results": [r.as_dict() for r in results]})


_REQUIRED = ("run", "setting", "method", "model", "benchmark", "metric", "value", "n", "num_prompts")


def _entry(raw: Any, where: str) -> BenchmarkResult:
    if not isinstance(raw, dict):
        raise ResultsError(f"{where} is a {type(raw).__name__}, expected an object")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ResultsError(f"{where} has no field {missing[0]!r}")
    unknown = sorted(set(raw) - set(BenchmarkResult.__dataclass_fields__))
    if unknown:
        raise ResultsError(f"{where} has unknown field {unknown[0]!r}")
    for name in ("metrics", "settings"):
        if not isinstance(raw.get(name, {}), dict):
            raise ResultsError(f"{where} field {name!r} must be an object")
    try:
        return BenchmarkResult(**raw)
    except ResultsError as err:
        raise ResultsError(f"{where}: {err}") from None


def _read_file(path: Path, required: bool) -> list[BenchmarkResult]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        if required:
            raise ResultsError(f"{path}: invalid JSON ({err})") from err
        return []
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        if required:
            raise ResultsError(f"{path}: not a results file (needs \"schema\": {RESULTS_SCHEMA!r})")
        return []
    if not isinstance(data.get("results"), list):
        raise ResultsError(f"{path}: field 'results' must be a list")
    return [_entry(raw, f"{path}: results[{i}]") for i, raw in enumerate(data["results"])]


def read_results(paths: Iterable[str | Path]) -> list[BenchmarkResult]:
    """Entries of results files; a folder contributes every ``*.json`` under it that is a results file."""
    out: list[BenchmarkResult] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*.json")):
                out.extend(_read_file(f, required=False))
        elif p.is_file():
            out.extend(_read_file(p, required=True))
        else:
            raise ResultsError(f"{p}: no such results file or folder")
    return out
