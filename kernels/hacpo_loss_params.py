"""The loss kernel's parameters and bookkeeping, shared by the Triton kernels, the torch twin and the dispatcher
(:mod:`hacpo_kernels.hacpo_loss`, whose docstring holds the formulas): the choices, :class:`LossParams` and its one set
of rules (:func:`check_loss_params`), :class:`LossTotals`, and the per-program counters (:data:`STATS`) with the
metrics read from them."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch

from ._utils import HAS_TRITON, tl

LOSS_AGGS = ("seq-mean-token-mean", "token-mean")
RATIO_LEVELS = ("sequence", "token")
LOG_RATIO_CLIP_MODES = ("symmetric", "upper")
CROSS_CLIP_MODES = ("clamp", "pessimistic")
FOREIGN_RULES = ("cross", "self_clip")
"""How foreign rows are trained: ``cross`` (HACPO, eqs. 10-14) or ``self_clip`` (Naive: the own-row GSPO clip)."""
ROLLOUT_IS_LEVELS = ("token", "sequence")
"""Where the training-inference correction weight is taken: per own token, or per row (the mean over the source's
tokens; foreign rows are always corrected per row)."""
ROLLOUT_IS_MODES = ("truncate", "mask")
"""What the correction does with a weight outside its bounds: truncate it to the upper bound, or drop the unit."""

KL_LOG_RATIO_LIMIT = 20.0
"""The k3 KL clamps ref_logp - logp to +-20 before exponentiating, so fp32 never overflows (verl ``low_var_kl``)."""
KL_VALUE_LIMIT = 10.0
"""The per-token k3 value is then clamped to [-10, 10] (verl ``low_var_kl``); outside, its gradient is zero."""

STATS = (
    "loss",            # sum of the policy term (per-row objectives, or token objectives with token-mean)
    "rows",            # non-empty rows
    "tokens",          # valid tokens
    "own_units",       # own units (rows at sequence level, tokens at token level)
    "own_below",       # own units with s < 1 - eps_low
    "own_above",       # own units with s > 1 + eps_high
    "own_ratio",       # sum of s over own units
    "foreign_units",
    "foreign_below",   # foreign units with s < lo
    "foreign_above",   # foreign units with s > hi
    "foreign_ratio",
    "own_rows",        # non-empty own rows
    "foreign_rows",    # non-empty foreign rows
    "kl",              # sum of the KL term
    "own_tokens",
    "fpos_units",      # foreign units with A > 0
    "fpos_below",
    "fpos_above",
    "fneg_units",      # foreign units with A < 0
    "fneg_below",
    "fneg_above",
    # training-inference correction (rollout_is; all 0 when it is off): units are own tokens (level "token") or own
    # rows, and foreign rows
    "is_own_units",
    "is_own_truncated",  # w > C (truncate)
    "is_own_masked",     # w outside [C_low, C] (mask)
    "is_own_weight",     # sum of the applied weights rho
    "is_foreign_units",
    "is_foreign_truncated",
    "is_foreign_masked",
    "is_foreign_weight",
)
"""The per-program partial sums, in storage order: the Triton kernel stores ``S_<NAME>`` offsets, the twin stacks a
dict in this order, and :data:`_RATIO_METRICS` reads them by name."""
(S_LOSS, S_ROWS, S_TOKENS, S_OWN_UNITS, S_OWN_BELOW, S_OWN_ABOVE, S_OWN_RATIO, S_FOREIGN_UNITS, S_FOREIGN_BELOW,
 S_FOREIGN_ABOVE, S_FOREIGN_RATIO, S_OWN_ROWS, S_FOREIGN_ROWS, S_KL, S_OWN_TOKENS, S_FPOS_UNITS, S_FPOS_BELOW,
 S_FPOS_ABOVE, S_FNEG_UNITS, S_FNEG_BELOW, S_FNEG_ABOVE, S_IS_OWN_UNITS, S_IS_OWN_TRUNCATED, S_IS_OWN_MASKED,
 S_IS_OWN_WEIGHT, S_IS_FOREIGN_UNITS, S_IS_FOREIGN_TRUNCATED, S_IS_FOREIGN_MASKED,
 S_IS_FOREIGN_WEIGHT) = (tl.constexpr(i) if HAS_TRITON else i for i in range(len(STATS)))
NUM_STATS = len(STATS)
_STAT_INDEX = {name: i for i, name in enumerate(STATS)}

_RATIO_METRICS = {
    # name: (numerator as {stat: weight}, denominator stat or None for 1); a denominator is clamped to >= 1
    "own_clip_frac_lower": ({"own_below": 1}, "own_units"),
    "own_clip_frac_upper": ({"own_above": 1}, "own_units"),
    "foreign_clip_frac_lower": ({"foreign_below": 1}, "foreign_units"),
    "foreign_clip_frac_upper": ({"foreign_above": 1}, "foreign_units"),
    "foreign_in_window_frac": ({"foreign_units": 1, "foreign_below": -1, "foreign_above": -1}, "foreign_units"),
    "foreign_pos_clip_frac_lower": ({"fpos_below": 1}, "fpos_units"),
    "foreign_pos_clip_frac_upper": ({"fpos_above": 1}, "fpos_units"),
    "foreign_pos_in_window_frac": ({"fpos_units": 1, "fpos_below": -1, "fpos_above": -1}, "fpos_units"),
    "foreign_neg_clip_frac_lower": ({"fneg_below": 1}, "fneg_units"),
    "foreign_neg_clip_frac_upper": ({"fneg_above": 1}, "fneg_units"),
    "foreign_neg_in_window_frac": ({"fneg_units": 1, "fneg_below": -1, "fneg_above": -1}, "fneg_units"),
    "own_ratio_mean": ({"own_ratio": 1}, "own_units"),
    "foreign_ratio_mean": ({"foreign_ratio": 1}, "foreign_units"),
    "num_own": ({"own_rows": 1}, None),
    "num_foreign": ({"foreign_rows": 1}, None),
}
"""Every logged statistic is (a signed sum of counters) / max(a counter, 1): the in-window fraction is
(n - below - above) / max(n, 1), which is 0 when no unit of the kind exists."""

METRIC_NAMES = ("pg_loss", "kl") + tuple(_RATIO_METRICS)
"""The metrics :func:`hacpo_loss` returns: the two loss terms and the ratio metrics above."""

_ROLLOUT_IS_METRICS = {
    "rollout_is_own_truncated_frac": ({"is_own_truncated": 1}, "is_own_units"),
    "rollout_is_own_masked_frac": ({"is_own_masked": 1}, "is_own_units"),
    "rollout_is_own_weight_mean": ({"is_own_weight": 1}, "is_own_units"),
    "rollout_is_foreign_truncated_frac": ({"is_foreign_truncated": 1}, "is_foreign_units"),
    "rollout_is_foreign_masked_frac": ({"is_foreign_masked": 1}, "is_foreign_units"),
    "rollout_is_foreign_weight_mean": ({"is_foreign_weight": 1}, "is_foreign_units"),
}
"""The training-inference correction's metrics, read like :data:`_RATIO_METRICS`: the share of its units whose
weight was truncated / masked, and the mean applied weight rho (0 for a masked unit). Units: own tokens (level
``token``) or own rows, and foreign rows."""

ROLLOUT_IS_METRIC_NAMES = tuple(_ROLLOUT_IS_METRICS)
"""The metrics :func:`hacpo_loss` adds to :data:`METRIC_NAMES` when ``LossParams.rollout_is`` is on (absent when it
is off, so a run without the correction logs what it logged before)."""

METRIC_WEIGHTS = {
    "own_clip_frac_lower": "own_rows",
    "own_clip_frac_upper": "own_rows",
    "foreign_clip_frac_lower": "foreign_rows",
    "foreign_clip_frac_upper": "foreign_rows",
    "foreign_in_window_frac": "foreign_rows",
    "foreign_pos_clip_frac_lower": "fpos_units",
    "foreign_pos_clip_frac_upper": "fpos_units",
    "foreign_pos_in_window_frac": "fpos_units",
    "foreign_neg_clip_frac_lower": "fneg_units",
    "foreign_neg_clip_frac_upper": "fneg_units",
    "foreign_neg_in_window_frac": "fneg_units",
    "own_ratio_mean": "own_rows",
    "foreign_ratio_mean": "foreign_rows",
    "rollout_is_own_truncated_frac": "is_own_units",
    "rollout_is_own_masked_frac": "is_own_units",
    "rollout_is_own_weight_mean": "is_own_units",
    "rollout_is_foreign_truncated_frac": "is_foreign_units",
    "rollout_is_foreign_masked_frac": "is_foreign_units",
    "rollout_is_foreign_weight_mean": "is_foreign_units",
}
"""The counter of :data:`STATS` each ratio metric is weighted by when micro-batch values are averaged. The loss terms
``pg_loss`` and ``kl`` are not averaged: each call's value is its share of the mini-batch's term (the denominators
are the mini-batch totals), so the shares add up; nor are the counts ``num_own`` / ``num_foreign``."""


def cross_clip_lower_bound(delta: float, delta_step: float, update_index: int, stepwise: bool = True) -> float:
    """Lower end of the foreign-row ratio window: ``min(1, 1 - delta + m * delta_step)`` (eq. 14), or ``1 - delta``
    (eq. 13) when not stepwise."""
    if isinstance(update_index, bool) or int(update_index) != update_index or update_index < 0:
        raise ValueError(f"update_index must be an int >= 0, got {update_index!r}")
    if stepwise:
        return min(1.0, 1.0 - delta + int(update_index) * delta_step)
    return 1.0 - delta


def _fail(label: str, rule: str, value) -> None:
    raise ValueError(f"{label} must be {rule}, got {value!r}")


def _real(label: str, value, *, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(label, "a number", value)
    if not math.isfinite(value):
        _fail(label, "finite", value)
    if minimum is not None and value < minimum:
        _fail(label, f">= {minimum:g}", value)


def _choice(label: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(label, f"one of {list(choices)}", value)


def check_loss_params(values: Mapping[str, Any], owner: str = "LossParams", names: Mapping[str, str] | None = None
                      ) -> None:
    """The one set of rules for the loss hyperparameters (the fields of :class:`LossParams`; missing ones take their
    defaults). ``owner`` and ``names`` (field → how the user wrote it, e.g. its flag) name the field at fault:
    ``"<name> must be <rule>, got <value>"``, ``name`` defaulting to ``<owner>.<field>``."""
    names = names or {}
    v = {f.name: f.default for f in fields(LossParams)}
    unknown = sorted(set(values) - set(v))
    if unknown:
        raise ValueError(f"{owner}: unknown loss parameter(s) {unknown}")
    v.update(values)

    def name(field: str) -> str:
        return names.get(field, f"{owner}.{field}")

    for field in ("eps_low", "eps_high", "delta", "delta_step", "alpha", "kl_coef"):
        _real(name(field), v[field], minimum=0.0)
    if v["eps_low"] >= 1:
        _fail(name("eps_low"), "< 1", v["eps_low"])
    if v["delta"] > 1:
        _fail(name("delta"), "<= 1", v["delta"])
    for field in ("stepwise", "cross_clip"):
        if not isinstance(v[field], bool):
            _fail(name(field), "a bool", v[field])
    cross_clip_lower_bound(v["delta"], v["delta_step"], v["update_index"], v["stepwise"])
    _real(name("cross_clip_high"), v["cross_clip_high"], minimum=1.0)
    _choice(name("cross_clip_mode"), v["cross_clip_mode"], CROSS_CLIP_MODES)
    _real(name("cross_clip_dual"), v["cross_clip_dual"])
    if not v["cross_clip_dual"] >= v["cross_clip_high"]:
        _fail(name("cross_clip_dual"), f">= cross_clip_high ({v['cross_clip_high']})", v["cross_clip_dual"])
    if v["dual_clip_c"] is not None:
        _real(name("dual_clip_c"), v["dual_clip_c"])
        if not v["dual_clip_c"] > 1.0 + v["eps_high"]:
            _fail(name("dual_clip_c"), f"> 1 + eps_high ({1.0 + v['eps_high']:g}) or None",
                  v["dual_clip_c"])
    if v["log_ratio_clip"] is not None:
        _real(name("log_ratio_clip"), v["log_ratio_clip"])
        if v["log_ratio_clip"] <= 0:
            _fail(name("log_ratio_clip"), "> 0 or None", v["log_ratio_clip"])
    _choice(name("log_ratio_clip_mode"), v["log_ratio_clip_mode"], LOG_RATIO_CLIP_MODES)
    _choice(name("ratio_level"), v["ratio_level"], RATIO_LEVELS)
    _choice(name("loss_agg"), v["loss_agg"], LOSS_AGGS)
    _choice(name("foreign_rule"), v["foreign_rule"], FOREIGN_RULES)
    _check_rollout_is(v, name)


_ROLLOUT_IS_DEFAULTS = {"rollout_is_level": "sequence", "rollout_is_mode": "truncate", "rollout_is_threshold": 2.0,
                        "rollout_is_threshold_lower": None}


def _check_rollout_is(v: Mapping[str, Any], name) -> None:
    """The training-inference correction's rules: its settings need it on; the upper bound C >= 1 (a weight of 1,
    no mismatch, is never cut); the lower bound (mask only) in (0, 1], below C."""
    if not isinstance(v["rollout_is"], bool):
        _fail(name("rollout_is"), "a bool", v["rollout_is"])
    _choice(name("rollout_is_level"), v["rollout_is_level"], ROLLOUT_IS_LEVELS)
    _choice(name("rollout_is_mode"), v["rollout_is_mode"], ROLLOUT_IS_MODES)
    _real(name("rollout_is_threshold"), v["rollout_is_threshold"], minimum=1.0)
    lower = v["rollout_is_threshold_lower"]
    if lower is not None:
        _real(name("rollout_is_threshold_lower"), lower)
        if not 0.0 < lower <= 1.0:
            _fail(name("rollout_is_threshold_lower"), "in (0, 1] or None", lower)
        if not lower < v["rollout_is_threshold"]:
            _fail(name("rollout_is_threshold_lower"), f"< rollout_is_threshold ({v['rollout_is_threshold']:g})",
                  lower)
        if v["rollout_is_mode"] != "mask":
            raise ValueError(f"{name('rollout_is_threshold_lower')} = {lower!r} is a bound of the mask mode, but "
                             f"{name('rollout_is_mode')} is {v['rollout_is_mode']!r} (truncate has no lower bound)")
    elif v["rollout_is_mode"] == "mask" and not v["rollout_is_threshold"] > 1.0:
        _fail(name("rollout_is_threshold"), "> 1 in mask mode without a lower bound (the window [1/C, C] is a point)",
              v["rollout_is_threshold"])
    if not v["rollout_is"]:
        for field, default in _ROLLOUT_IS_DEFAULTS.items():
            if v[field] != default:
                raise ValueError(f"{name(field)} = {v[field]!r} sets the training-inference correction, which is "
                                 f"off: turn it on with {name('rollout_is')}")


@dataclass(frozen=True)
class LossParams:
    """Every hyperparameter of the loss at one optimizer update ``m``, validated once when built.

    ``openrlhf_hacpo.algorithms.get_policy_loss(name).params(cfg, m)`` builds it from the run's config; the Triton
    launch and the torch twin read it (and nothing else).

    * ``eps_low`` / ``eps_high``: own-row clip ``[1 - eps_low, 1 + eps_high]`` (eqs. 47-49).
    * ``delta``, ``delta_step``, ``stepwise``, ``update_index``: the foreign window's lower end ``lo`` (eqs. 13-14).
    * ``cross_clip`` (``False``: ``c = s``), ``cross_clip_high`` (``hi``), ``cross_clip_mode`` (``clamp`` |
      ``pessimistic``), ``cross_clip_dual`` (pessimistic mode's dual clip, ``>= cross_clip_high``).
    * ``alpha``: exponential importance sampling, ``sg(c)^alpha`` (eq. 12).
    * ``foreign_rule``: ``cross`` (HACPO) or ``self_clip`` (Naive).
    * ``dual_clip_c``: dual clip of the own-row rule, ``max(min(wA, clip(w)A), c A)`` for ``A < 0`` (verl's
      ``clip_ratio_c``; the ``grpo`` loss), ``None`` for none; must exceed ``1 + eps_high``.
    * ``log_ratio_clip`` (``None``: none) and ``log_ratio_clip_mode``; ``ratio_level``; ``loss_agg``; ``kl_coef``.
    * ``rollout_is`` (off by default): the training-inference correction (module docstring of
      :mod:`hacpo_kernels.hacpo_loss`, "Training-inference correction"): ``rollout_is_level`` (``token`` | ``sequence``,
      own rows; foreign rows always ``sequence``), ``rollout_is_mode`` (``truncate`` | ``mask``),
      ``rollout_is_threshold`` (the upper bound C >= 1) and ``rollout_is_threshold_lower`` (mask only; ``None``:
      1 / C). Each needs ``rollout_is``.
    """

    eps_low: float = 3e-4
    eps_high: float = 4e-4
    delta: float = 0.2
    delta_step: float = 0.025
    stepwise: bool = True
    update_index: int = 0
    cross_clip: bool = True
    cross_clip_high: float = 1.0
    cross_clip_mode: str = "clamp"
    cross_clip_dual: float = 3.0
    alpha: float = 1.0
    foreign_rule: str = "cross"
    dual_clip_c: float | None = None
    log_ratio_clip: float | None = 10.0
    log_ratio_clip_mode: str = "symmetric"
    ratio_level: str = "sequence"
    loss_agg: str = "seq-mean-token-mean"
    kl_coef: float = 0.0
    rollout_is: bool = False
    rollout_is_level: str = "sequence"
    rollout_is_mode: str = "truncate"
    rollout_is_threshold: float = 2.0
    rollout_is_threshold_lower: float | None = None

    def __post_init__(self) -> None:
        check_loss_params(vars(self))

    # ---------------------------------------------------------------------------------------- derived launch values
    @property
    def self_clip(self) -> bool:
        return self.foreign_rule == "self_clip"

    @property
    def lo(self) -> float:
        """Lower end of the foreign window at this update (Naive: the own-row window, for its foreign metrics)."""
        if self.self_clip:
            return 1.0 - self.eps_low
        return cross_clip_lower_bound(self.delta, self.delta_step, self.update_index, self.stepwise)

    @property
    def hi(self) -> float:
        return 1.0 + self.eps_high if self.self_clip else float(self.cross_clip_high)

    @property
    def token_level(self) -> bool:
        return self.ratio_level == "token"

    @property
    def token_mean(self) -> bool:
        return self.loss_agg == "token-mean"

    @property
    def cross_min(self) -> bool:
        return self.cross_clip and self.cross_clip_mode == "pessimistic"

    @property
    def clip_mode(self) -> int:
        """0: no log-ratio clamp; 1: symmetric; 2: upper."""
        if self.log_ratio_clip is None:
            return 0
        return 1 if self.log_ratio_clip_mode == "symmetric" else 2

    @property
    def clip_val(self) -> float:
        return float(self.log_ratio_clip) if self.log_ratio_clip is not None else 0.0

    @property
    def own_dual(self) -> float:
        return float(self.dual_clip_c) if self.dual_clip_c is not None else 0.0

    @property
    def is_mode(self) -> int:
        """The correction's launch switch: 0 off, 1 truncate, 2 mask."""
        if not self.rollout_is:
            return 0
        return 1 if self.rollout_is_mode == "truncate" else 2

    @property
    def is_token(self) -> bool:
        """Whether own rows take per-token correction weights (they need ``old_logp`` and ``engine_logp`` [B, T])."""
        return self.rollout_is and self.rollout_is_level == "token"

    @property
    def is_hi(self) -> float:
        """The correction's upper bound C."""
        return float(self.rollout_is_threshold)

    @property
    def is_lo(self) -> float:
        """The mask mode's lower bound C_low (``rollout_is_threshold_lower``, else 1 / C); 0 in truncate mode."""
        if self.rollout_is_mode != "mask":
            return 0.0
        lower = self.rollout_is_threshold_lower
        return float(lower) if lower is not None else 1.0 / float(self.rollout_is_threshold)


@dataclass(frozen=True)
class LossTotals:
    """Aggregation denominators: the global mini-batch's row / token counts (all rows and own rows) when a
    mini-batch is split into micro-batches; ``None`` counts the micro-batch itself. The KL denominators (own rows,
    own tokens) may be 0 (a mini-batch without own rows has no KL term) and are then taken as 1."""

    num_seqs: int | None = None
    num_tokens: int | None = None
    num_own_seqs: int | None = None
    num_own_tokens: int | None = None

    def __post_init__(self) -> None:
        for field, minimum in (("num_seqs", 1), ("num_tokens", 1), ("num_own_seqs", 0), ("num_own_tokens", 0)):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
                raise ValueError(f"LossTotals.{field} must be an int >= {minimum} or None, got {value!r}")


def _denominators(stats: torch.Tensor, params: LossParams, totals: LossTotals) -> tuple[torch.Tensor, torch.Tensor]:
    """(D, D_kl): the policy-gradient and KL aggregation denominators (given mini-batch totals, else counted)."""
    def pick(given, counted):
        if given is not None:
            return torch.full((), float(given), dtype=stats.dtype, device=stats.device)
        return counted.clamp(min=1.0)

    if params.token_mean:
        return (pick(totals.num_tokens, stat(stats, "tokens")),
                pick(totals.num_own_tokens, stat(stats, "own_tokens")).clamp(min=1.0))
    return pick(totals.num_seqs, stat(stats, "rows")), pick(totals.num_own_seqs, stat(stats, "own_rows")).clamp(min=1.0)


def stat(stats: torch.Tensor, name: str) -> torch.Tensor:
    """The counter ``name`` of :data:`STATS` in a ``stats`` vector returned by :func:`hacpo_loss`."""
    return stats[_STAT_INDEX[name]]

