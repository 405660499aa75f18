"""The arithmetic of ``benchmarks/throughput.py``: per-step figures from a run's ``metrics.jsonl`` records, their
summary per arm, ratios to GSPO and time to accuracy. Pure functions of the records they are given; nothing here
runs a job or touches a file.

Notation: a run logs one record per agent ``k`` and step ``s``; the warm-up steps ``s ≤ w`` are dropped; an arm's
measured steps are pooled over its rounds (runs).

* step seconds ``T_s`` = ``time/step`` (the controller's wall clock of the whole step; the same in every agent's
  record, the largest is taken); phases of the step: ``time/rollout_phase``, ``time/reward``,
  ``time/train_phase`` (shared), ``time/sync`` summed over agents, and ``other`` = ``T_s`` minus those four.
* per agent and step, every ``time/<phase>`` of :data:`AGENT_PHASES` (and any other per-agent ``time/*`` key a
  run logs) is kept as logged.
* rollouts ``R_s = Σ_k view/num_own_rows``; generated tokens ``Σ_k perf/tokens_generated``, else
  ``Σ_k response/tokens_mean · view/num_own_rows``; trained rows ``Σ_k perf/rows_trained``, else
  ``Σ_k view/num_rows``; trained tokens ``Σ_k perf/tokens_trained``, else
  ``Σ_k view/response_tokens_mean · view/num_rows`` (response tokens in each learner's own tokenizer);
  rows / tokens through a backward pass ``Σ_k perf/rows_backward`` / ``Σ_k perf/tokens_backward`` (absent: ``None``).
* an arm's step summary: median and quartiles of ``T_s`` (linear interpolation between order statistics,
  :func:`quantile`), median of each phase (medians of parts need not add up to the median of the whole);
  rates are ratios of sums over the measured steps, e.g. rollouts/s = ``Σ_s R_s / Σ_s T_s``.
* ratio to GSPO of a figure ``x``: ``x_arm / x_gspo`` (step seconds: > 1 is slower; rates: > 1 is faster).
* time to accuracy: an arm's training seconds up to step ``s`` are ``Σ_{t ≤ s} T_t`` (evaluation excluded, it
  costs every arm the same); the time to reach accuracy ``a*`` is that sum at the first evaluation with accuracy
  ``≥ a*`` (:func:`time_to_reach`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "AGENT_PHASES",
    "ARM_RATIO_FIELDS",
    "MISMATCH_KEYS",
    "STEP_PHASES",
    "agent_phase_keys",
    "arm_ratios",
    "foreign_backward_share",
    "median",
    "quantile",
    "step_figures",
    "steps_of",
    "summarize_agents",
    "summarize_arm",
    "time_to_reach",
]

STEP_PHASES = ("time/rollout_phase", "time/reward", "time/train_phase")
"""Controller-level phases, the same in every agent's record of a step (``time/sync`` is per agent, summed)."""
AGENT_PHASES = ("time/generate", "time/scoring", "time/logprob", "time/view", "time/advantages", "time/reference",
                "time/update", "time/sync", "time/wait")
"""Per-agent phases in the order they are shown; keys a run does not log are left out or shown as "–"."""
_NOT_AGENT_PHASES = {"time/step", *STEP_PHASES}
PAD_KEYS = ("perf/pad_frac_scoring", "perf/pad_frac_probe", "perf/pad_frac_update")
MISMATCH_KEYS = ("mismatch/mean_abs", "mismatch/max_abs", "mismatch/k3_kl")
"""The own rows' training-inference mismatch a run logs per agent and step (engine vs trainer log-probs of the
sampled tokens; :mod:`openrlhf_hacpo.algorithms.mismatch`), shown per agent as means over the measured steps."""
MEMORY_KEYS = {"perf/cuda_max_allocated_gib": "cuda_max_allocated_gib"}
"""GPU memory a worker logs (GiB, ``torch.cuda.max_memory_allocated`` since it started): max over agents and steps."""


# ---------------------------------------------------------------------------------------------------------- basics
def quantile(values: Sequence[float], p: float) -> float:
    """The ``p``-quantile with linear interpolation between order statistics: ``h = (n − 1) p``,
    ``q = x_(⌊h⌋) + (h − ⌊h⌋)(x_(⌊h⌋+1) − x_(⌊h⌋))`` on the sorted values (numpy's default)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"quantile p must be in [0, 1], got {p}")
    xs = sorted(float(v) for v in values)
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def _num(record: Mapping[str, Any], key: str) -> float | None:
    """``record[key]`` as a finite float, ``None`` when absent or not a finite number."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _sum_or_none(values: Iterable[float | None]) -> float | None:
    """Sum of the values, ``None`` when any is missing (a partial sum would understate the figure)."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return float(sum(values))


def steps_of(records: Sequence[Mapping[str, Any]], warmup: int) -> dict[int, list[Mapping[str, Any]]]:
    """One run's records grouped by step (ascending), warm-up steps ``≤ warmup`` dropped.

    A record without an integer ``step`` or a string ``agent`` is a ``ValueError`` naming its position."""
    by_step: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for i, rec in enumerate(records):
        step, agent = rec.get("step"), rec.get("agent")
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(agent, str):
            raise ValueError(f"metrics record {i} has no integer 'step' and string 'agent': {dict(rec)!r:.200}")
        if step > warmup:
            by_step[step].append(rec)
    return {s: by_step[s] for s in sorted(by_step)}


# ---------------------------------------------------------------------------------------------------------- one step
def step_figures(agent_records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of one step from its per-agent records (module docstring); ``None`` for what was not logged."""
    if not agent_records:
        raise ValueError("step_figures needs the records of at least one agent")
    steps = [_num(r, "time/step") for r in agent_records]
    if any(s is None for s in steps):
        raise ValueError(f"step {agent_records[0].get('step')}: a record has no numeric 'time/step'")
    step_s = max(steps)
    phases: dict[str, float | None] = {}
    for key in STEP_PHASES:
        vals = [v for v in (_num(r, key) for r in agent_records) if v is not None]
        phases[key] = max(vals) if vals else None
    phases["time/sync"] = _sum_or_none(_num(r, "time/sync") for r in agent_records)
    known = [v for v in phases.values() if v is not None]
    phases["other"] = step_s - sum(known) if len(known) == len(phases) else None

    own = [_num(r, "view/num_own_rows") for r in agent_records]
    rows = [_num(r, "view/num_rows") for r in agent_records]

    def per_agent(key: str, fallback) -> float | None:
        vals = []
        for r, o, n in zip(agent_records, own, rows):
            v = _num(r, key)
            vals.append(v if v is not None else fallback(r, o, n))
        return _sum_or_none(vals)

    def product(a: float | None, b: float | None) -> float | None:
        return a * b if a is not None and b is not None else None

    return {
        "step_s": step_s,
        "phases": phases,
        "rollouts": _sum_or_none(own),
        "tokens_generated": per_agent("perf/tokens_generated",
                                      lambda r, o, n: product(_num(r, "response/tokens_mean"), o)),
        "rows_trained": per_agent("perf/rows_trained", lambda r, o, n: n),
        "tokens_trained": per_agent("perf/tokens_trained",
                                    lambda r, o, n: product(_num(r, "view/response_tokens_mean"), n)),
        "rows_backward": _sum_or_none(_num(r, "perf/rows_backward") for r in agent_records),
        "tokens_backward": _sum_or_none(_num(r, "perf/tokens_backward") for r in agent_records),
        "foreign_rows": _sum_or_none(n - o if n is not None and o is not None else None for o, n in zip(own, rows)),
    }


def agent_phase_keys(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The per-agent ``time/*`` keys present in ``records``: those of :data:`AGENT_PHASES` in that order, then any
    other per-agent ``time/*`` key (sorted), so that a phase a newer trainer logs gets its column."""
    present = {k for r in records for k in r if k.startswith("time/") and k not in _NOT_AGENT_PHASES}
    return [k for k in AGENT_PHASES if k in present] + sorted(present - set(AGENT_PHASES))


# ---------------------------------------------------------------------------------------------------------- one arm
def _rate(numerators: Sequence[float | None], seconds: Sequence[float]) -> float | None:
    if not numerators or any(n is None for n in numerators) or sum(seconds) <= 0:
        return None
    return sum(numerators) / sum(seconds)


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def foreign_backward_share(figures: Sequence[Mapping[str, Any]]) -> float | None:
    """Share of foreign rows that went through a backward pass: ``(Σ rows_backward − Σ rollouts) / Σ foreign_rows``
    (own rows always do; ``None`` without ``perf/rows_backward`` or without foreign rows)."""
    back = _sum_or_none(f["rows_backward"] for f in figures)
    own = _sum_or_none(f["rollouts"] for f in figures)
    foreign = _sum_or_none(f["foreign_rows"] for f in figures)
    if back is None or own is None or not foreign:
        return None
    return (back - own) / foreign


def summarize_arm(runs: Sequence[Sequence[Mapping[str, Any]]], warmup: int) -> dict[str, Any]:
    """One arm's summary over its runs (each a list of ``metrics.jsonl`` records), warm-up steps dropped.

    Returns ``steps`` (measured steps pooled), ``step_s`` {median, q1, q3, iqr, min, max}, ``phases`` (median
    seconds of each step phase, ``None`` when not logged), ``rollouts_per_s``, ``tokens_generated_per_s``,
    ``rows_trained_per_s``, ``tokens_trained_per_s`` (ratios of sums), per-step means ``rows_trained``,
    ``tokens_trained``, ``rows_backward``, ``tokens_backward``, ``foreign_backward_share``, the mean padding
    fraction of each pass over agents and steps (``pad_frac_scoring``, ``pad_frac_probe``, ``pad_frac_update``) and
    the GPU memory figure when logged."""
    figures: list[dict[str, Any]] = []
    records_used: list[Mapping[str, Any]] = []
    for i, records in enumerate(runs):
        steps = steps_of(records, warmup)
        if not steps:
            raise ValueError(f"run {i} has no step after the {warmup} warm-up step(s)")
        for recs in steps.values():
            figures.append(step_figures(recs))
            records_used.extend(recs)
    if not figures:
        raise ValueError("summarize_arm needs at least one run")
    seconds = [f["step_s"] for f in figures]
    q1, q3 = quantile(seconds, 0.25), quantile(seconds, 0.75)
    phases = {}
    for key in figures[0]["phases"]:
        vals = [f["phases"][key] for f in figures]
        phases[key] = median(vals) if all(v is not None for v in vals) else None
    out: dict[str, Any] = {
        "steps": len(figures),
        "step_s": {"median": median(seconds), "q1": q1, "q3": q3, "iqr": q3 - q1, "min": min(seconds),
                   "max": max(seconds)},
        "phases": phases,
        "rollouts_per_step": _mean_or_none([f["rollouts"] for f in figures]),
        "rollouts_per_s": _rate([f["rollouts"] for f in figures], seconds),
        "tokens_generated_per_s": _rate([f["tokens_generated"] for f in figures], seconds),
        "rows_trained_per_s": _rate([f["rows_trained"] for f in figures], seconds),
        "tokens_trained_per_s": _rate([f["tokens_trained"] for f in figures], seconds),
        "rows_trained": _mean_or_none([f["rows_trained"] for f in figures]),
        "tokens_trained": _mean_or_none([f["tokens_trained"] for f in figures]),
        "rows_backward": _mean_or_none([f["rows_backward"] for f in figures]),
        "tokens_backward": _mean_or_none([f["tokens_backward"] for f in figures]),
        "foreign_backward_share": foreign_backward_share(figures),
    }
    for key in PAD_KEYS:
        vals = [_num(r, key) for r in records_used]
        out[key.split("/", 1)[1]] = _mean_or_none(vals)
    for key, name in MEMORY_KEYS.items():
        vals = [v for v in (_num(r, key) for r in records_used) if v is not None]
        out[name] = max(vals) if vals else None
    return out


def summarize_agents(runs: Sequence[Sequence[Mapping[str, Any]]], warmup: int) -> dict[str, dict[str, Any]]:
    """Per agent of one arm: the median of every per-agent ``time/*`` phase (:func:`agent_phase_keys`; ``None``
    when this arm does not log it), the mean ``policy/foreign_in_window_frac``, the per-step means of
    ``perf/rows_backward``, ``perf/pad_frac_scoring`` and ``perf/pad_frac_update``, and the means over steps of the
    own rows' training-inference mismatch (:data:`MISMATCH_KEYS`) (each ``None`` when absent)."""
    by_agent: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for records in runs:
        for recs in steps_of(records, warmup).values():
            for r in recs:
                by_agent[r["agent"]].append(r)
    out = {}
    for agent, recs in by_agent.items():
        entry: dict[str, Any] = {"steps": len(recs), "phases": {}}
        for key in agent_phase_keys(recs):
            vals = [_num(r, key) for r in recs]
            entry["phases"][key] = median(vals) if all(v is not None for v in vals) else None
        for key in ("policy/foreign_in_window_frac", "perf/rows_backward", "view/num_rows", *PAD_KEYS,
                    *MISMATCH_KEYS):
            vals = [_num(r, key) for r in recs]
            entry[key] = _mean_or_none(vals)
        out[agent] = entry
    return out


# ---------------------------------------------------------------------------------------------------------- ratios
ARM_RATIO_FIELDS = ("step_s.median", "phases.time/rollout_phase", "phases.time/train_phase", "phases.time/sync",
                    "rollouts_per_s", "tokens_generated_per_s", "rows_trained_per_s", "tokens_trained_per_s",
                    "rows_backward", "tokens_backward", "peak_rss_gib", "peak_pss_gib", "cuda_max_allocated_gib")
"""Figures of an arm summary compared with GSPO's (dotted paths into the summary)."""


def _get(summary: Mapping[str, Any], path: str) -> float | None:
    head, _, rest = path.partition(".")
    value = summary.get(head)
    if rest:
        value = value.get(rest) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def arm_ratios(summary: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float | None]:
    """``x_arm / x_baseline`` for every field of :data:`ARM_RATIO_FIELDS` (``None`` when either is missing or the
    baseline is 0)."""
    out = {}
    for field in ARM_RATIO_FIELDS:
        a, b = _get(summary, field), _get(baseline, field)
        out[field] = a / b if a is not None and b else None
    return out


# ---------------------------------------------------------------------------------------------------------- accuracy
def time_to_reach(curve: Sequence[tuple[int, float]], step_seconds: Mapping[int, float], target: float
                  ) -> dict[str, Any] | None:
    """The first evaluation of ``curve`` (``[(step, accuracy), ...]``) with accuracy ``≥ target``, and the training
    seconds ``Σ_{t ≤ step} step_seconds[t]`` up to it; ``None`` when no evaluation reaches it.

    A step of ``step_seconds`` missing below the reaching step is a ``ValueError`` (the sum would be short)."""
    for step, acc in sorted(curve):
        if acc >= target:
            missing = [t for t in range(1, step + 1) if t not in step_seconds]
            if missing:
                raise ValueError(f"no time/step for step(s) {missing[:5]} before the evaluation at step {step}")
            return {"step": step, "accuracy": acc, "seconds": sum(step_seconds[t] for t in range(1, step + 1))}
    return None
