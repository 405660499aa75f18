"""A run beside the README's numbers: the committed comparison of the same preset, arm and agents.

``benchmarks/compare_tiny.py`` writes ``benchmarks/results/tiny_<preset>.json`` (``tiny_<preset>_<N>steps.json`` for
a non-default step count): per arm its settings (algorithm, G, trainer flags) and every seed's final accuracy, and
in ``meta.agent_fingerprints`` the fingerprints of the agents it ran. :func:`compare_with_reference` finds the arm with the
run's settings and puts the run's final accuracy beside that arm's seed spread:

* the mean x̄ and sample standard deviation s of the n reference seeds, their range, and the reference seed equal to
  the run's seed when there is one;
* the 95% **prediction interval for one more run**, x̄ ± t_{0.975, n−1} · s · √(1 + 1/n) (the spread of a new
  draw around a mean estimated from n draws). Training on another machine, or with another thread count, rounds
  differently in the last bits, RL amplifies that, and after 80 steps a run is another draw from the seed
  distribution even with the same seed and agents; so this interval is where a run on another machine is expected
  to land, and a run outside it is atypical.

The comparison is only meaningful for the same agents: when the run's agent fingerprints differ from the
reference's (a rebuilt agent, or a reference measured before the agents shipped) it says so instead.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from openrlhf_hacpo.zoo.presets import DEFAULT_REGIME

__all__ = [
    "REFERENCE_LEVEL",
    "compare_with_reference",
    "default_results_dir",
    "format_reference_note",
    "load_reference",
    "prediction_interval",
    "reference_path",
    "report_stem",
    "student_t_quantile",
]

REFERENCE_LEVEL = 0.95
"""Coverage of the prediction interval."""


# ---------------------------------------------------------------------------------------------------------- statistics
def _student_t_two_sided(t: float, dof: int) -> float:
    """A(t | ν) = P(|T| ≤ t) for Student's t with ν = ``dof`` degrees of freedom, t ≥ 0 (Abramowitz & Stegun 26.7.3
    and 26.7.4, θ = atan(t / √ν)):

    * ν odd: A = (2/π) [θ + sin θ (cos θ + (2/3) cos³θ + … + (2·4···(ν−3)) / (1·3···(ν−2)) cos^(ν−2) θ)]
      (for ν = 1 the bracket is θ alone);
    * ν even: A = sin θ [1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + … + (1·3···(ν−3)) / (2·4···(ν−2)) cos^(ν−2) θ].
    """
    theta = math.atan(t / math.sqrt(dof))
    s, c = math.sin(theta), math.cos(theta)
    if dof % 2 == 1:
        total, term = 0.0, c
        for k in range(1, (dof - 1) // 2 + 1):   # terms cos^(2k-1) θ with coefficients (2·4···(2k−2)) / (1·3···(2k−1))
            if k > 1:
                term *= c * c * (2 * k - 2) / (2 * k - 1)
            total += term
        return 2.0 / math.pi * (theta + s * total)
    total, term = 1.0, 1.0
    for k in range(1, dof // 2):                  # terms cos^(2k) θ with coefficients (1·3···(2k−1)) / (2·4···2k)
        term *= c * c * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def student_t_quantile(p: float, dof: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with ``dof`` ≥ 1 degrees of freedom, by bisection on
    P(|T| ≤ t) = 2p − 1 (:func:`_student_t_two_sided`), to 1e-12."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"student_t_quantile needs 0.5 < p < 1, got {p}")
    if isinstance(dof, bool) or not isinstance(dof, int) or dof < 1:
        raise ValueError(f"student_t_quantile needs an integer dof >= 1, got {dof!r}")
    target = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while _student_t_two_sided(hi, dof) < target:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _student_t_two_sided(mid, dof) < target else (lo, mid)
    return 0.5 * (lo + hi)


def prediction_interval(values: Sequence[float], level: float = REFERENCE_LEVEL) -> tuple[float, float] | None:
    """x̄ ± t_{(1+level)/2, n−1} · s · √(1 + 1/n): where one more draw lands with probability ``level`` (normal
    draws); ``None`` for fewer than two values."""
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        return None
    mean, std = statistics.fmean(values), statistics.stdev(values)
    half = student_t_quantile((1.0 + level) / 2.0, n - 1) * std * math.sqrt(1.0 + 1.0 / n)
    return mean - half, mean + half


# ---------------------------------------------------------------------------------------------------------- files
def default_results_dir() -> Path | None:
    """``<repo>/benchmarks/results`` of a source checkout, else ``None`` (an installed package has no results)."""
    repo = Path(__file__).resolve().parents[2]
    folder = repo / "benchmarks" / "results"
    return folder if (repo / "setup.py").is_file() and folder.is_dir() else None


def report_stem(preset: str, steps: int, default_steps: int, regime: str = DEFAULT_REGIME) -> str:
    """The name of a comparison report without its suffix: ``tiny_<preset>``, with ``_<steps>steps`` when ``steps``
    is not the preset's default and ``_<regime>`` for a regime other than the default (``benchmarks/compare_tiny.py``
    writes it, the main job reads it)."""
    stem = f"tiny_{preset}" if steps == default_steps else f"tiny_{preset}_{steps}steps"
    return stem if regime == DEFAULT_REGIME else f"{stem}_{regime}"


def reference_path(preset: str, steps: int, default_steps: int, results_dir: str | os.PathLike | None = None,
                   regime: str = DEFAULT_REGIME) -> Path | None:
    """``<report_stem>.json`` in ``results_dir`` (default :func:`default_results_dir`); ``None`` without a results
    folder."""
    folder = Path(results_dir) if results_dir is not None else default_results_dir()
    if folder is None:
        return None
    return folder / f"{report_stem(preset, steps, default_steps, regime)}.json"


def load_reference(path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """The reference report at ``path`` and ``None``, or ``None`` and why there is none."""
    if path is None:
        return None, ("no README reference: benchmarks/results/ is part of the source checkout, not of an installed "
                      "package")
    if not path.is_file():
        return None, f"no README reference for these settings: {path} does not exist"
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except json.JSONDecodeError as err:
        return None, f"no README reference: {path} is not valid JSON ({err})"


# ---------------------------------------------------------------------------------------------------------- comparison
def _find_arm(reference: Mapping[str, Any], run: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    wanted = {"algorithm": run.get("algorithm"), "regime": run.get("regime", DEFAULT_REGIME),
              "n_samples_per_prompt": run.get("n_samples_per_prompt"), "extra_args": list(run.get("extra_args") or [])}
    for name, arm in reference.get("arms", {}).items():
        settings = arm.get("settings")
        # references made before regimes existed are single-update
        if settings and all({"regime": DEFAULT_REGIME, **settings}.get(k) == v for k, v in wanted.items()):
            return name, arm
    return None


def compare_with_reference(summary: Mapping[str, Any], reference: Mapping[str, Any] | None,
                           reason: str | None = None, source: str | None = None) -> dict[str, Any]:
    """The run of ``summary`` beside the reference arm with its settings.

    Returns ``{"status", "note", "source", "arm", "seeds", "agents"}``: ``status`` is ``"compared"``, or
    ``"no_reference"`` / ``"no_arm"`` / ``"other_agents"`` with ``note`` saying why; per agent (when compared) the
    run's final accuracy, the reference's mean, std, min, max, same-seed value, before-training accuracy, the
    prediction interval (cut to [0, 1]) and ``typical`` (the run's final accuracy inside it)."""
    out: dict[str, Any] = {"status": "no_reference", "note": reason, "source": source, "arm": None, "seeds": [],
                           "agents": {}}
    if reference is None:
        return out
    run = summary["run"]
    ref_agents = reference.get("meta", {}).get("agent_fingerprints")
    used = run.get("agents_used") or {}
    if not ref_agents:
        out.update(status="other_agents", note=(
            "the README reference was measured with earlier agents built on first use (not the shipped ones), so a "
            "run cannot be compared with it"))
        return out
    differ = {name: (used.get(name, {}).get("fingerprint"), ref_agents.get(name, {}).get("fingerprint"))
              for name in summary["agents"]}
    differ = {n: fps for n, fps in differ.items() if fps[0] is None or fps[0] != fps[1]}
    if differ:
        out.update(status="other_agents", note="this run's agents are not the ones the README measured: " + "; ".join(
            f"{n} {a or 'unknown'} vs {b or 'absent'}" for n, (a, b) in differ.items())
            + " (a rebuilt agent has its own fingerprint); no comparison")
        return out
    found = _find_arm(reference, run)
    if found is None:
        out.update(status="no_arm", note=(
            f"the README reference ({source or 'tiny_' + str(run.get('preset')) + '.json'}) has no arm with algorithm "
            f"{run.get('algorithm')}, G={run.get('n_samples_per_prompt')} and trainer flags "
            f"{list(run.get('extra_args') or []) or 'none'}"))
        return out
    arm_name, arm = found
    out.update(status="compared", arm=arm_name, seeds=list(arm.get("seeds", [])))
    seed = str(run.get("seed"))
    for name, entry in summary["agents"].items():
        ref = arm["agents"][name]
        finals = [float(v) for v in ref["final_by_seed"].values()]
        interval = prediction_interval(finals)
        if interval is not None:                        # an accuracy lies in [0, 1]
            interval = (max(0.0, interval[0]), min(1.0, interval[1]))
        value = float(entry["acc_final"])
        out["agents"][name] = {
            "run_final": value,
            "run_before": float(entry["acc_before"]),
            "ref_before": ref.get("acc_before"),
            "ref_mean": statistics.fmean(finals),
            "ref_std": statistics.stdev(finals) if len(finals) > 1 else None,
            "ref_min": min(finals),
            "ref_max": max(finals),
            "ref_same_seed": ref["final_by_seed"].get(seed),
            "interval": list(interval) if interval else None,
            "typical": (interval[0] <= value <= interval[1]) if interval else None,
        }
    return out


def format_reference_note(comparison: Mapping[str, Any]) -> str:
    """One or two lines under the table: which reference arm and seeds, or why there is no comparison."""
    if comparison["status"] != "compared":
        return f"README comparison: {comparison['note']}."
    seeds = comparison["seeds"]
    atypical = [n for n, a in comparison["agents"].items() if a["typical"] is False]
    verdict = ("every agent is inside the range expected of one run" if not atypical else
               f"outside the range expected of one run: {', '.join(atypical)}")
    return (f"README: arm {comparison['arm']!r} of {comparison['source']}, {len(seeds)} seeds ({', '.join(map(str, seeds))}) "
            f"with the same agents; expected range = {REFERENCE_LEVEL:.0%} prediction interval for one more run, "
            f"mean ± t·s·√(1 + 1/n). This run: {verdict}.")
