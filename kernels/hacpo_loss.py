r"""HACPO / GSPO / GRPO / Naive policy loss on ``[B, T]`` token log-probs: one Triton launch forward, one backward.

This module is the only place where the loss math lives: the Triton kernels for CUDA tensors and a plain-torch
twin for everything else, chosen by :func:`hacpo_kernels.dispatch.resolve_backend`. The registered policy losses
of ``openrlhf_hacpo.algorithms.losses`` call :func:`hacpo_loss`.

Per sequence ``i`` (learner ``k``, source agent ``j``, optimizer-step index ``m`` inside the training step),
with ``L_i = \sum_t mask_{i,t}`` (paper v1 numbering):

* sequence ratio (GSPO, Def. D.4 eq. 25/48; cross-agent eq. 11):
  ``\ell_i = \frac{1}{L_i}\sum_t mask_{i,t}\log\pi_\theta(y_{i,t}) - \overline{\log\pi_{old}}_i`` (the old side is
  the source policy's masked mean over its own tokens), clamped to ``[-C, C]`` (``symmetric``) or ``(-\infty, C]``
  (``upper``), ``s_i = e^{\ell_i}``;
* own rows (``j = k``, GSPO clip, eq. 47-49):
  ``obj_i = \min(s_i A_i,\ \mathrm{clip}(s_i, 1-\epsilon_{low}, 1+\epsilon_{high}) A_i)``;
* foreign rows (``j \ne k``): stepwise window (eq. 13-14/52) ``lo = \min(1, 1 - \delta + m\,\delta_{step})``
  (``1 - \delta`` when not stepwise), ``c_i = \mathrm{clamp}(s_i, lo, hi)`` with ``hi = 1`` (paper and official
  code; ``cross_clip_high`` raises it), exponential importance sampling (eq. 12) and capability coefficient
  (eq. 10): ``obj_i = c_i\,\mathrm{sg}(c_i)^{\alpha}\,\omega_i A_i``.
  No ``min()``: the gradient is zero outside ``[lo, hi]`` whatever the sign of ``A_i``. With
  ``cross_clip=False`` the clamp is dropped (``c_i = s_i``).

* Naive sharing (``foreign_rule="self_clip"``): every row, own or foreign, uses the own-row clip; ``coef`` unused.
* Dual clip of the own-row rule (``dual_clip_c = c``, the ``grpo`` loss; verl's ``clip_ratio_c = 3``):
  ``obj = \max(\min(wA, \mathrm{clip}(w)A),\ cA)`` for ``A < 0``, so a token far likelier than under the old
  policy (``w > c``) with a negative advantage passes no gradient.
* KL (``kl_coef > 0``, ``ref_logp``): ``+ \beta\,\mathrm{KL}`` with the low-variance estimate
  ``k3 = \mathrm{clamp}(e^{d} - d - 1, \pm 10)``, ``d = \mathrm{clamp}(\log\pi_{ref} - \log\pi_\theta, \pm 20)``
  (verl's ``low_var_kl``), on own tokens only, aggregated like the policy term (mean over own rows of per-row token
  means, or over own tokens); ``\partial k3/\partial\log\pi_\theta = 1 - e^{d}`` inside both clamps, 0 outside.

Token-level ratios (``ratio_level="token"``, needs ``old_logp [B, T]``) apply the same rules to every token with
``\ell_{i,t} = \log\pi_\theta(y_{i,t}) - \log\pi_{old}(y_{i,t})``; the sequence objective is then the masked mean
of the token objectives.

Aggregation (loss is minimised, hence the minus sign; per-token objective ``o_{i,t}`` equals ``obj_i`` at
sequence level):

* ``seq-mean-token-mean``: ``loss = -\frac{1}{D}\sum_i obj_i`` with ``D = num_seqs`` or the number of non-empty
  rows;
* ``token-mean``: ``loss = -\frac{1}{D}\sum_{i,t} mask_{i,t}\, o_{i,t}`` with ``D = num_tokens`` or ``\sum_i L_i``.

Passing the mini-batch totals as ``num_seqs`` / ``num_tokens`` makes the losses of micro-batches add up to the
mini-batch loss. Rows with no valid token have objective 0 and no gradient.

Gradient (sequence level): ``\partial loss/\partial\log\pi_{i,t} = -\frac{1}{D}\,w_i\,\frac{\partial obj_i}{\partial
\ell_i}\,\frac{mask_{i,t}}{L_i}`` with ``w_i = 1`` (seq-mean) or ``L_i`` (token-mean) and
``\partial obj/\partial\ell = s A\,1[sA \le \mathrm{clip}(s)A]`` (own), ``s\,c^\alpha\omega A\,1[lo \le s \le hi]``
(foreign), times ``1[\ell`` inside the log-ratio clamp``]``.

Metrics (0-d tensors, no device sync; :data:`METRIC_NAMES`, each averaged with the weight in :data:`METRIC_WEIGHTS`):
``own_clip_frac_lower`` / ``own_clip_frac_upper`` (own units with ``s < 1-\epsilon_{low}`` / ``s > 1+\epsilon_{high}``),
``foreign_clip_frac_lower`` / ``foreign_clip_frac_upper`` / ``foreign_in_window_frac`` (foreign units with
``s < lo`` / ``s > hi`` / inside ``[lo, hi]``), ``own_ratio_mean`` / ``foreign_ratio_mean`` (mean ``s``), and the row
counts ``num_own`` / ``num_foreign``; ``foreign_pos_*`` the same window fractions among foreign units with
``A > 0`` and ``foreign_neg_*`` among those with ``A < 0``; ``pg_loss`` and ``kl`` (the two terms of the loss). A unit is a non-empty sequence (sequence level) or a
valid token (token level).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, NamedTuple

import torch

from ._utils import FLOAT_DTYPES, HAS_TRITON, cdiv, is_interpreted, next_power_of_2, tl, triton
from .dispatch import resolve_backend

__all__ = [
    "hacpo_loss",
    "HacpoLossOutput",
    "LossParams",
    "LossTotals",
    "check_loss_params",
    "cross_clip_lower_bound",
    "STATS",
    "METRIC_NAMES",
    "LOSS_AGGS",
    "RATIO_LEVELS",
    "LOG_RATIO_CLIP_MODES",
    "CROSS_CLIP_MODES",
    "FOREIGN_RULES",
    "KL_LOG_RATIO_LIMIT",
    "KL_VALUE_LIMIT",
    "METRIC_WEIGHTS",
    "NUM_STATS",
    "stat",
]

LOSS_AGGS = ("seq-mean-token-mean", "token-mean")
RATIO_LEVELS = ("sequence", "token")
LOG_RATIO_CLIP_MODES = ("symmetric", "upper")
CROSS_CLIP_MODES = ("clamp", "pessimistic")
FOREIGN_RULES = ("cross", "self_clip")
"""How foreign rows are trained: ``cross`` (HACPO, eqs. 10-14) or ``self_clip`` (Naive: the own-row GSPO clip)."""

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
)
"""The per-program partial sums, in storage order: the Triton kernel stores ``S_<NAME>`` offsets, the twin stacks a
dict in this order, and :data:`_RATIO_METRICS` reads them by name."""
(S_LOSS, S_ROWS, S_TOKENS, S_OWN_UNITS, S_OWN_BELOW, S_OWN_ABOVE, S_OWN_RATIO, S_FOREIGN_UNITS, S_FOREIGN_BELOW,
 S_FOREIGN_ABOVE, S_FOREIGN_RATIO, S_OWN_ROWS, S_FOREIGN_ROWS, S_KL, S_OWN_TOKENS, S_FPOS_UNITS, S_FPOS_BELOW,
 S_FPOS_ABOVE, S_FNEG_UNITS, S_FNEG_BELOW, S_FNEG_ABOVE) = (tl.constexpr(i) if HAS_TRITON else i for i in range(len(STATS)))
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
}
"""The counter of :data:`STATS` each ratio metric is weighted by when micro-batch values are averaged. The loss terms
``pg_loss`` and ``kl`` are not averaged: each call's value is its share of the mini-batch's term (the denominators
are the mini-batch totals), so the shares add up; nor are the counts ``num_own`` / ``num_foreign``."""


class HacpoLossOutput(NamedTuple):
    """``loss`` 0-d (to minimise); ``objectives`` [B] detached per-row objectives; ``ratios`` [B] detached sequence
    ratios s after the log-ratio clamp (``None`` at token level); ``metrics`` 0-d tensors named in
    :data:`METRIC_NAMES`; ``stats`` [NUM_STATS] the summed counters of :data:`STATS` (metric weights)."""

    loss: torch.Tensor
    objectives: torch.Tensor
    ratios: torch.Tensor | None
    metrics: dict[str, torch.Tensor]
    stats: torch.Tensor | None = None


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
# --------------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _clip_log_ratio(ell, clip_val, CLIP_MODE: tl.constexpr):
    """Returns (clamped log-ratio, 1.0 where the clamp passes the gradient else 0.0)."""
    if CLIP_MODE == 1:
        ell_c = tl.minimum(tl.maximum(ell, -clip_val), clip_val)
        passes = ((ell >= -clip_val) & (ell <= clip_val)).to(tl.float32)
    elif CLIP_MODE == 2:
        ell_c = tl.minimum(ell, clip_val)
        passes = (ell <= clip_val).to(tl.float32)
    else:
        ell_c = ell
        passes = tl.full(ell.shape, 1.0, tl.float32)
    return ell_c, passes


@triton.jit
def _objective(s, adv, self_rule, coef, eps_low, eps_high, lo, hi, dual, own_dual, alpha, CROSS_CLIP: tl.constexpr,
               CROSS_MIN: tl.constexpr, OWN_DUAL: tl.constexpr):
    """Per-unit objective and d objective / d log-ratio (before the log-ratio clamp mask).

    ``self_rule`` is True for units trained with the own-row GSPO clip (own rows; every row under Naive)."""
    s_cl = tl.minimum(tl.maximum(s, 1.0 - eps_low), 1.0 + eps_high)
    own_obj = tl.minimum(s * adv, s_cl * adv)
    own_d = tl.where(s * adv <= s_cl * adv, s * adv, 0.0)
    if OWN_DUAL:
        # dual clip (verl clip_ratio_c): a negative advantage's objective is bounded below by c·A
        own_cut = (adv < 0.0) & (own_dual * adv > own_obj)
        own_obj = tl.where(own_cut, own_dual * adv, own_obj)
        own_d = tl.where(own_cut, 0.0, own_d)
    if CROSS_CLIP:
        c = tl.minimum(tl.maximum(s, lo), hi)
        in_window = (s >= lo) & (s <= hi)
    else:
        c = s
        in_window = s == s
    weight = tl.where(alpha == 0.0, 1.0, tl.exp(alpha * tl.log(c)))
    if CROSS_MIN:
        # pessimistic rule: max(min(s·A, c·A), dual·A [A < 0])·sg(c)^α·ω; gradient where s·A is the value
        pess = tl.minimum(s * adv, c * adv)
        dual_cut = (adv < 0.0) & (dual * adv > pess)
        for_obj = tl.where(dual_cut, dual * adv, pess) * weight * coef
        for_d = tl.where((s * adv <= c * adv) & (dual_cut == 0), s * weight * coef * adv, 0.0)
    else:
        for_obj = c * weight * coef * adv
        for_d = tl.where(in_window, s * weight * coef * adv, 0.0)
    obj = tl.where(self_rule, own_obj, for_obj)
    dobj = tl.where(self_rule, own_d, for_d)
    return obj, dobj


@triton.jit
def _k3(lp, ref, kl_limit, kl_max):
    """Low-variance KL per token, min(exp(d) - d - 1, kl_max) with d = clamp(ref - lp, ±limit), and d k3 / d lp
    (zero where either clamp is active; k3 >= 0, so only the upper value clamp can act)."""
    d = ref - lp
    d_c = tl.minimum(tl.maximum(d, -kl_limit), kl_limit)
    e = tl.exp(d_c)
    k3 = e - d_c - 1.0
    passes = ((d >= -kl_limit) & (d <= kl_limit) & (k3 <= kl_max)).to(tl.float32)
    return tl.minimum(k3, kl_max), (1.0 - e) * passes


@triton.jit
def _hacpo_fwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, old_mean_ptr, own_ptr, coef_ptr,
    obj_ptr, ratio_ptr, rowg_ptr, rowkl_ptr, partial_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, own_dual_arg, alpha_arg, clip_arg, kl_limit_arg, kl_max_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    OWN_DUAL: tl.constexpr, FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, TOKEN_MEAN: tl.constexpr,
    NUM_STATS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """BLOCK_B rows per program: masked sums over T tiles, per-row objective and gradient factors, partial sums."""
    pid = tl.program_id(0)
    eps_low = tl.cast(eps_low_arg, tl.float32)
    eps_high = tl.cast(eps_high_arg, tl.float32)
    lo = tl.cast(lo_arg, tl.float32)
    hi = tl.cast(hi_arg, tl.float32)
    dual = tl.cast(dual_arg, tl.float32)
    own_dual = tl.cast(own_dual_arg, tl.float32)
    alpha = tl.cast(alpha_arg, tl.float32)
    clip_val = tl.cast(clip_arg, tl.float32)
    kl_limit = tl.cast(kl_limit_arg, tl.float32)
    kl_max = tl.cast(kl_max_arg, tl.float32)

    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    adv = tl.load(adv_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
    own = tl.load(own_ptr + rows64, mask=row_ok, other=0) != 0
    coef = tl.load(coef_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
    if FOREIGN_SELF:
        self_rule = row_ok | own
    else:
        self_rule = own
    cols = tl.arange(0, BLOCK_T)

    count = tl.zeros([BLOCK_B], dtype=tl.float32)
    acc = tl.zeros([BLOCK_B], dtype=tl.float32)  # sum of logp (sequence level) or of token objectives (token level)
    kl_acc = tl.zeros([BLOCK_B], dtype=tl.float32)
    own_low = tl.zeros([BLOCK_B], dtype=tl.float32)
    own_high = tl.zeros([BLOCK_B], dtype=tl.float32)
    for_below = tl.zeros([BLOCK_B], dtype=tl.float32)
    for_above = tl.zeros([BLOCK_B], dtype=tl.float32)
    ratio_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    for t0 in range(0, n_cols, BLOCK_T):
        t = t0 + cols
        in_bounds = row_ok[:, None] & (t[None, :] < n_cols)
        valid = tl.load(mask_ptr + rows64[:, None] * stride_mk + t[None, :], mask=in_bounds, other=0) != 0
        valid = valid & in_bounds
        lp = tl.load(logp_ptr + rows64[:, None] * stride_lp + t[None, :], mask=valid, other=0.0).to(tl.float32)
        count += tl.sum(valid.to(tl.float32), axis=1)
        if HAS_KL:
            own_tok = valid & own[:, None]
            ref = tl.load(ref_ptr + rows64[:, None] * stride_ref + t[None, :], mask=own_tok, other=0.0)
            k3, _dk3 = _k3(lp, ref.to(tl.float32), kl_limit, kl_max)
            kl_acc += tl.sum(tl.where(own_tok, k3, 0.0), axis=1)
        if TOKEN_LEVEL:
            old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=valid, other=0.0).to(tl.float32)
            ell, _passes = _clip_log_ratio(lp - old, clip_val, CLIP_MODE)
            s = tl.exp(ell)
            obj_t, _d = _objective(s, adv[:, None], self_rule[:, None], coef[:, None], eps_low, eps_high, lo, hi,
                                   dual, own_dual, alpha, CROSS_CLIP, CROSS_MIN, OWN_DUAL)
            acc += tl.sum(tl.where(valid, obj_t, 0.0), axis=1)
            own_t = valid & own[:, None]
            for_t = valid & (own[:, None] == 0)
            own_low += tl.sum((own_t & (s < 1.0 - eps_low)).to(tl.float32), axis=1)
            own_high += tl.sum((own_t & (s > 1.0 + eps_high)).to(tl.float32), axis=1)
            for_below += tl.sum((for_t & (s < lo)).to(tl.float32), axis=1)
            for_above += tl.sum((for_t & (s > hi)).to(tl.float32), axis=1)
            ratio_sum += tl.sum(tl.where(valid, s, 0.0), axis=1)
        else:
            acc += tl.sum(lp, axis=1)

    nonempty = count > 0.0
    safe_count = tl.maximum(count, 1.0)
    if TOKEN_LEVEL:
        obj = acc / safe_count
        if TOKEN_MEAN:
            loss_part = acc
            rowg = tl.where(nonempty, 1.0, 0.0)
        else:
            loss_part = obj
            rowg = tl.where(nonempty, 1.0 / safe_count, 0.0)
        own_units = tl.where(own, count, 0.0)
        for_units = tl.where(own, 0.0, count)
        own_ratio = tl.where(own, ratio_sum, 0.0)
        for_ratio = tl.where(own, 0.0, ratio_sum)
    else:
        old_mean = tl.load(old_mean_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        ell, passes = _clip_log_ratio(acc / safe_count - old_mean, clip_val, CLIP_MODE)
        s = tl.exp(ell)
        obj, dobj = _objective(s, adv, self_rule, coef, eps_low, eps_high, lo, hi, dual, own_dual, alpha,
                               CROSS_CLIP, CROSS_MIN, OWN_DUAL)
        obj = tl.where(nonempty, obj, 0.0)
        tl.store(ratio_ptr + rows64, tl.where(nonempty, s, 0.0), mask=row_ok)
        if TOKEN_MEAN:
            loss_part = obj * count
            rowg = tl.where(nonempty, dobj * passes, 0.0)
        else:
            loss_part = obj
            rowg = tl.where(nonempty, dobj * passes / safe_count, 0.0)
        own_row = nonempty & own
        for_row = nonempty & (own == 0)
        own_units = own_row.to(tl.float32)
        for_units = for_row.to(tl.float32)
        own_low = (own_row & (s < 1.0 - eps_low)).to(tl.float32)
        own_high = (own_row & (s > 1.0 + eps_high)).to(tl.float32)
        for_below = (for_row & (s < lo)).to(tl.float32)
        for_above = (for_row & (s > hi)).to(tl.float32)
        own_ratio = tl.where(own_row, s, 0.0)
        for_ratio = tl.where(for_row, s, 0.0)
    own_rows = nonempty & own
    if HAS_KL:
        if TOKEN_MEAN:
            kl_part = kl_acc
            rowkl = tl.where(own_rows, 1.0, 0.0)
        else:
            kl_part = kl_acc / safe_count
            rowkl = tl.where(own_rows, 1.0 / safe_count, 0.0)
        tl.store(rowkl_ptr + rows64, rowkl, mask=row_ok)
    else:
        kl_part = kl_acc
    positive = adv > 0.0
    negative = adv < 0.0

    tl.store(obj_ptr + rows64, obj, mask=row_ok)
    tl.store(rowg_ptr + rows64, rowg, mask=row_ok)
    base = partial_ptr + pid.to(tl.int64) * NUM_STATS
    tl.store(base + S_LOSS, tl.sum(tl.where(row_ok, loss_part, 0.0), axis=0))
    tl.store(base + S_ROWS, tl.sum(nonempty.to(tl.float32), axis=0))
    tl.store(base + S_TOKENS, tl.sum(count, axis=0))
    tl.store(base + S_OWN_UNITS, tl.sum(own_units, axis=0))
    tl.store(base + S_OWN_BELOW, tl.sum(own_low, axis=0))
    tl.store(base + S_OWN_ABOVE, tl.sum(own_high, axis=0))
    tl.store(base + S_OWN_RATIO, tl.sum(own_ratio, axis=0))
    tl.store(base + S_FOREIGN_UNITS, tl.sum(for_units, axis=0))
    tl.store(base + S_FOREIGN_BELOW, tl.sum(for_below, axis=0))
    tl.store(base + S_FOREIGN_ABOVE, tl.sum(for_above, axis=0))
    tl.store(base + S_FOREIGN_RATIO, tl.sum(for_ratio, axis=0))
    tl.store(base + S_OWN_ROWS, tl.sum(own_rows.to(tl.float32), axis=0))
    tl.store(base + S_FOREIGN_ROWS, tl.sum((nonempty & (own == 0)).to(tl.float32), axis=0))
    tl.store(base + S_KL, tl.sum(tl.where(row_ok, kl_part, 0.0), axis=0))
    tl.store(base + S_OWN_TOKENS, tl.sum(tl.where(own, count, 0.0), axis=0))
    tl.store(base + S_FPOS_UNITS, tl.sum(tl.where(positive, for_units, 0.0), axis=0))
    tl.store(base + S_FPOS_BELOW, tl.sum(tl.where(positive, for_below, 0.0), axis=0))
    tl.store(base + S_FPOS_ABOVE, tl.sum(tl.where(positive, for_above, 0.0), axis=0))
    tl.store(base + S_FNEG_UNITS, tl.sum(tl.where(negative, for_units, 0.0), axis=0))
    tl.store(base + S_FNEG_BELOW, tl.sum(tl.where(negative, for_below, 0.0), axis=0))
    tl.store(base + S_FNEG_ABOVE, tl.sum(tl.where(negative, for_above, 0.0), axis=0))


@triton.jit
def _hacpo_bwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, own_ptr, coef_ptr, rowg_ptr, rowkl_ptr, scale_ptr, grad_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref, stride_g,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, own_dual_arg, alpha_arg, clip_arg, kl_limit_arg, kl_max_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    OWN_DUAL: tl.constexpr, FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """d loss / d logp[i, t] = pg_scale * mask * (row factor [* d o_t / d ell_t at token level])
    + kl_scale * own mask * row KL weight * d k3 / d logp, with pg_scale = -dloss / D, kl_scale = dloss·β / D_kl."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    in_bounds = row_ok[:, None] & (t[None, :] < n_cols)
    pg_scale = tl.load(scale_ptr).to(tl.float32)
    valid = tl.load(mask_ptr + rows64[:, None] * stride_mk + t[None, :], mask=in_bounds, other=0) != 0
    valid = valid & in_bounds
    rowg = tl.load(rowg_ptr + rows64, mask=row_ok, other=0.0)
    if TOKEN_LEVEL or HAS_KL:
        lp = tl.load(logp_ptr + rows64[:, None] * stride_lp + t[None, :], mask=valid, other=0.0).to(tl.float32)
        own = tl.load(own_ptr + rows64, mask=row_ok, other=0) != 0
    if TOKEN_LEVEL:
        eps_low = tl.cast(eps_low_arg, tl.float32)
        eps_high = tl.cast(eps_high_arg, tl.float32)
        lo = tl.cast(lo_arg, tl.float32)
        hi = tl.cast(hi_arg, tl.float32)
        dual = tl.cast(dual_arg, tl.float32)
        own_dual = tl.cast(own_dual_arg, tl.float32)
        alpha = tl.cast(alpha_arg, tl.float32)
        clip_val = tl.cast(clip_arg, tl.float32)
        adv = tl.load(adv_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        coef = tl.load(coef_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        if FOREIGN_SELF:
            self_rule = row_ok | own
        else:
            self_rule = own
        old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=valid, other=0.0).to(tl.float32)
        ell, passes = _clip_log_ratio(lp - old, clip_val, CLIP_MODE)
        _obj, dobj = _objective(tl.exp(ell), adv[:, None], self_rule[:, None], coef[:, None], eps_low, eps_high,
                                lo, hi, dual, own_dual, alpha, CROSS_CLIP, CROSS_MIN, OWN_DUAL)
        g = pg_scale * dobj * passes * rowg[:, None]
    else:
        g = tl.zeros([BLOCK_B, BLOCK_T], dtype=tl.float32) + pg_scale * rowg[:, None]
    if HAS_KL:
        kl_scale = tl.load(scale_ptr + 1).to(tl.float32)
        kl_limit = tl.cast(kl_limit_arg, tl.float32)
        kl_max = tl.cast(kl_max_arg, tl.float32)
        own_tok = valid & own[:, None]
        ref = tl.load(ref_ptr + rows64[:, None] * stride_ref + t[None, :], mask=own_tok, other=0.0).to(tl.float32)
        _k, dk3 = _k3(lp, ref, kl_limit, kl_max)
        rowkl = tl.load(rowkl_ptr + rows64, mask=row_ok, other=0.0)
        g += tl.where(own_tok, kl_scale * rowkl[:, None] * dk3, 0.0)
    grad = tl.where(valid, g, 0.0)
    tl.store(grad_ptr + rows64[:, None] * stride_g + t[None, :], grad.to(grad_ptr.dtype.element_ty), mask=in_bounds)


FWD_TILE = (1, 2048, 4)
"""Forward launch: (rows per program, tokens per inner step, warps); each program walks its rows' tokens. Chosen by
``benchmarks/tune_loss_tiles.py`` on an H200 (``benchmarks/results/loss_tiles_cuda.md``): one row per program gives
enough programs to fill the GPU; 16 rows per program ran 2.3x slower at B·T = 16M."""
BWD_TILE = (2, 1024, 4)
"""Backward launch: (rows, tokens, warps) of one program's tile of ``d logp`` (a 2-D grid); same sweep."""
INTERPRETER_TILES: tuple[tuple[int, int, int], tuple[int, int, int]] | None = ((16, 128, 4), (16, 128, 4))
"""(forward, backward) tiles under Triton's interpreter, where many one-row programs are slow (each program is a
Python loop); ``None`` uses the GPU tiles. tests/kernels runs the GPU tiles under the interpreter as well."""


def _tile(backward: bool, n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_T, warps) of the forward or backward launch: the GPU tile (the interpreter's when the kernel
    runs interpreted), shrunk to the input's size."""
    kernel = _hacpo_bwd_kernel if backward else _hacpo_fwd_kernel
    if INTERPRETER_TILES and is_interpreted(kernel):
        block_b, block_t, warps = INTERPRETER_TILES[int(backward)]
    else:
        block_b, block_t, warps = BWD_TILE if backward else FWD_TILE
    return min(block_b, max(next_power_of_2(n_rows), 1)), min(block_t, max(next_power_of_2(n_cols), 16)), warps


def _as_loadable(x: torch.Tensor) -> torch.Tensor:
    """Bool tensors are handed to Triton as uint8 (same bytes, no copy)."""
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def _rowwise(x: torch.Tensor | None) -> torch.Tensor | None:
    if x is None:
        return None
    x = _as_loadable(x)
    return x if x.stride(-1) == 1 else x.contiguous()


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


def _launch_args(params: LossParams) -> tuple[tuple, dict]:
    """The scalar arguments and compile-time switches shared by the forward and backward launches."""
    scalars = (params.eps_low, params.eps_high, params.lo, params.hi, params.cross_clip_dual, params.own_dual,
               params.alpha, params.clip_val, KL_LOG_RATIO_LIMIT, KL_VALUE_LIMIT)
    switches = dict(TOKEN_LEVEL=params.token_level, CLIP_MODE=params.clip_mode, CROSS_CLIP=params.cross_clip,
                    CROSS_MIN=params.cross_min, OWN_DUAL=params.dual_clip_c is not None,
                    FOREIGN_SELF=params.self_clip)
    return tuple(float(x) for x in scalars), switches


class _HacpoLossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, params, totals):
        n_rows, n_cols = logp.shape
        dev = logp.device
        block_b, block_t, warps = _tile(False, n_rows, n_cols)
        n_prog = max(cdiv(n_rows, block_b), 1)
        obj = torch.empty(n_rows, dtype=torch.float32, device=dev)
        ratio = torch.zeros(n_rows, dtype=torch.float32, device=dev)
        rowg = torch.empty(n_rows, dtype=torch.float32, device=dev)
        rowkl = torch.zeros(n_rows, dtype=torch.float32, device=dev)
        partials = torch.empty((n_prog, NUM_STATS), dtype=torch.float32, device=dev)
        old_arg = old_logp if old_logp is not None else logp
        ref_arg = ref_logp if ref_logp is not None else logp
        old_mean_arg = old_mean if old_mean is not None else adv
        scalars, switches = _launch_args(params)
        if n_rows == 0:
            partials.zero_()
        else:
            _hacpo_fwd_kernel[(n_prog,)](
                logp, mask, old_arg, ref_arg, adv, old_mean_arg, own, coef, obj, ratio, rowg, rowkl, partials,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), ref_arg.stride(0), *scalars,
                HAS_KL=ref_logp is not None, TOKEN_MEAN=params.token_mean, NUM_STATS=NUM_STATS, BLOCK_B=block_b,
                BLOCK_T=block_t, num_warps=warps, **switches,
            )
        stats = partials.sum(dim=0) if n_prog > 1 else partials[0]
        denom, kl_denom = _denominators(stats, params, totals)
        pg_loss = -stat(stats, "loss") / denom
        kl = stat(stats, "kl") / kl_denom
        loss = pg_loss + params.kl_coef * kl
        ctx.save_for_backward(logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, denom, kl_denom)
        ctx.params, ctx.has_kl = params, ref_logp is not None
        ctx.mark_non_differentiable(obj, ratio, stats, pg_loss, kl)
        return loss, obj, ratio, stats, pg_loss, kl

    @staticmethod
    def backward(ctx, dloss, *_unused):
        logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, denom, kl_denom = ctx.saved_tensors
        params = ctx.params
        n_rows, n_cols = logp.shape
        grad = torch.empty((n_rows, n_cols), dtype=logp.dtype, device=logp.device)
        if dloss is None:
            return (grad.zero_(),) + (None,) * 9
        scales = torch.stack([-dloss / denom, dloss * params.kl_coef / kl_denom]).to(torch.float32)
        block_b, block_t, warps = _tile(True, n_rows, n_cols)
        scalars, switches = _launch_args(params)
        if n_rows and n_cols:
            _hacpo_bwd_kernel[(cdiv(n_rows, block_b), cdiv(n_cols, block_t))](
                logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, scales, grad,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), ref_arg.stride(0),
                grad.stride(0), *scalars, HAS_KL=ctx.has_kl, BLOCK_B=block_b, BLOCK_T=block_t, num_warps=warps,
                **switches,
            )
        return (grad,) + (None,) * 9


# --------------------------------------------------------------------------------------------------------------
# torch twin (plain differentiable torch ops): the algorithm core of eqs. 6-14 and 47-53 on the CPU
# --------------------------------------------------------------------------------------------------------------
def _hacpo_loss_torch(logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, params: LossParams,
                      totals: LossTotals):
    p = params
    cdt = torch.float64 if logp.dtype == torch.float64 else torch.float32
    valid = mask != 0
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    lp = torch.where(valid, logp.to(cdt), zero)  # padding may hold anything, even NaN
    vf = valid.to(cdt)
    count = vf.sum(dim=-1)
    nonempty = count > 0
    safe_count = count.clamp(min=1.0)
    adv = adv.to(cdt)
    coef = coef.to(cdt)
    own = own != 0
    self_rule = torch.ones_like(own) if p.self_clip else own
    lo, hi = p.lo, p.hi
    if p.token_level:
        ell = torch.where(valid, lp - old_logp.to(cdt), zero)
        a, o, w = adv[:, None], self_rule[:, None], coef[:, None]
    else:
        ell = lp.sum(dim=-1) / safe_count - old_mean.to(cdt)
        a, o, w = adv, self_rule, coef
    if p.clip_mode == 1:
        ell = ell.clamp(-p.clip_val, p.clip_val)
    elif p.clip_mode == 2:
        ell = ell.clamp(max=p.clip_val)
    s = ell.exp()
    # own rows (and every row under Naive): min(s·A, clip(s, 1 - eps_low, 1 + eps_high)·A)   (eqs. 47-49)
    own_obj = torch.minimum(s * a, s.clamp(1.0 - p.eps_low, 1.0 + p.eps_high) * a)
    if p.dual_clip_c is not None:  # GRPO dual clip: max(min(...), c·A) for A < 0 (verl clip_ratio_c)
        own_obj = torch.where((a < 0) & (p.dual_clip_c * a > own_obj), p.dual_clip_c * a, own_obj)
    # foreign rows: c·sg(c)^α·ω·A with c = clamp(s, lo_m, hi)                                  (eqs. 10-14, 50-52)
    c = s.clamp(lo, hi) if p.cross_clip else s
    weight = c.detach().pow(p.alpha) * w
    if p.cross_min:
        pess = torch.minimum(s * a, c * a)
        dual = p.cross_clip_dual
        for_obj = torch.where((a < 0) & (dual * a > pess), dual * a, pess) * weight
    else:
        for_obj = c * weight * a
    unit_obj = torch.where(o, own_obj, for_obj)
    if p.token_level:
        unit_obj = torch.where(valid, unit_obj, zero)
        obj = unit_obj.sum(dim=-1) / safe_count
        loss_sum = unit_obj.sum() if p.token_mean else obj.sum()
        own_u, for_u = valid & own[:, None], valid & ~own[:, None]
        positive, negative = (adv > 0)[:, None], (adv < 0)[:, None]
        ratio = None
    else:
        obj = torch.where(nonempty, unit_obj, torch.zeros_like(unit_obj))
        loss_sum = (obj * count).sum() if p.token_mean else obj.sum()
        own_u, for_u = nonempty & own, nonempty & ~own
        positive, negative = adv > 0, adv < 0
        ratio = torch.where(nonempty, s.detach(), torch.zeros_like(s))
    # low-variance KL (k3) to the reference policy on own tokens, clamped like verl's low_var_kl
    kl_sum = zero
    if ref_logp is not None:
        own_tok = valid & own[:, None]
        d = torch.where(own_tok, ref_logp.to(cdt) - lp, zero).clamp(-KL_LOG_RATIO_LIMIT, KL_LOG_RATIO_LIMIT)
        k3 = (d.exp() - d - 1.0).clamp(-KL_VALUE_LIMIT, KL_VALUE_LIMIT)
        k3 = torch.where(own_tok, k3, zero).sum(dim=-1)
        kl_sum = k3.sum() if p.token_mean else (k3 / safe_count).sum()
    sd = s.detach()
    fpos, fneg = for_u & positive, for_u & negative

    def total(x: torch.Tensor) -> torch.Tensor:
        return x.sum().to(cdt)

    values = {
        "loss": loss_sum.detach(),
        "rows": total(nonempty),
        "tokens": count.sum(),
        "own_units": total(own_u),
        "own_below": total(own_u & (sd < 1.0 - p.eps_low)),
        "own_above": total(own_u & (sd > 1.0 + p.eps_high)),
        "own_ratio": torch.where(own_u, sd, torch.zeros_like(sd)).sum(),
        "foreign_units": total(for_u),
        "foreign_below": total(for_u & (sd < lo)),
        "foreign_above": total(for_u & (sd > hi)),
        "foreign_ratio": torch.where(for_u, sd, torch.zeros_like(sd)).sum(),
        "own_rows": total(nonempty & own),
        "foreign_rows": total(nonempty & ~own),
        "kl": kl_sum.detach(),
        "own_tokens": torch.where(own, count, zero).sum(),
        "fpos_units": total(fpos),
        "fpos_below": total(fpos & (sd < lo)),
        "fpos_above": total(fpos & (sd > hi)),
        "fneg_units": total(fneg),
        "fneg_below": total(fneg & (sd < lo)),
        "fneg_above": total(fneg & (sd > hi)),
    }
    stats = torch.stack([values[name] for name in STATS])
    denom, kl_denom = _denominators(stats, p, totals)
    pg_loss = -loss_sum / denom
    kl = kl_sum / kl_denom
    loss = pg_loss + p.kl_coef * kl
    return loss, obj.detach(), ratio, stats, pg_loss.detach(), kl.detach()


# --------------------------------------------------------------------------------------------------------------
# public function
# --------------------------------------------------------------------------------------------------------------
_metric_weights_cache: dict = {}


def _metric_weights(device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """([2, K, S] numerator/denominator weights, [K] denominator offset) on ``device``, built once per device."""
    key = (str(device), dtype)
    if key not in _metric_weights_cache:
        weights = torch.zeros(2, len(_RATIO_METRICS), NUM_STATS, dtype=dtype)
        offset = torch.zeros(len(_RATIO_METRICS), dtype=dtype)
        for k, (numerator, denominator) in enumerate(_RATIO_METRICS.values()):
            for stat, w in numerator.items():
                weights[0, k, _STAT_INDEX[stat]] = w
            if denominator is None:
                offset[k] = 1.0
            else:
                weights[1, k, _STAT_INDEX[denominator]] = 1.0
        _metric_weights_cache[key] = (weights.to(device), offset.to(device))
    return _metric_weights_cache[key]


def _metrics_from_stats(stats: torch.Tensor, pg_loss: torch.Tensor, kl: torch.Tensor) -> dict[str, torch.Tensor]:
    """All ratio metrics in a few elementwise launches (no matmul: TF32 would round the counters)."""
    weights, offset = _metric_weights(stats.device, stats.dtype)
    num_den = (weights * stats).sum(dim=-1)
    values = num_den[0] / (num_den[1] + offset).clamp(min=1.0)
    metrics = {"pg_loss": pg_loss, "kl": kl}
    metrics.update({name: values[k] for k, name in enumerate(_RATIO_METRICS)})
    return metrics


def stat(stats: torch.Tensor, name: str) -> torch.Tensor:
    """The counter ``name`` of :data:`STATS` in a ``stats`` vector returned by :func:`hacpo_loss`."""
    return stats[_STAT_INDEX[name]]


def _check_tensor(x: torch.Tensor | None, name: str, shape: tuple[int, ...], device) -> None:
    if x is None:
        raise ValueError(f"{name} is required")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device}")


def hacpo_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logp_mean: torch.Tensor | None,
    is_own: torch.Tensor,
    coef: torch.Tensor,
    params: LossParams | None = None,
    *,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    totals: LossTotals | None = None,
    backend: str = "auto",
) -> HacpoLossOutput:
    """HACPO / GSPO / GRPO / Naive loss for one learner on a micro-batch of ``B`` rows (formulas in the module
    docstring).

    Args:
        logp: ``[B, T]`` current token log-probs of the learner (differentiable).
        mask: ``[B, T]`` bool/int/float, nonzero where a token counts.
        advantages: ``[B]`` capability-aware advantages ``A_i`` (eq. 6).
        old_logp_mean: ``[B]`` masked mean of the source policy's old log-probs (sequence level; may be ``None``
            at token level).
        is_own: ``[B]`` bool, True where the row was generated by the learner itself.
        coef: ``[B]`` capability coefficient ``omega^(j,k)`` (1 for own rows, eq. 10).
        params: :class:`LossParams` (validated when built; default ``LossParams()``).
        old_logp: ``[B, T]`` old token log-probs on the same tokens (token level only).
        ref_logp: ``[B, T]`` reference log-probs of the low-variance (k3) KL on own tokens (weight
            ``params.kl_coef``), ``min(exp(d) - d - 1, 10)`` with ``d = clamp(ref - logp, ±20)``, aggregated like
            the policy term over own rows or own tokens; the metric ``kl`` is reported whenever it is given.
        totals: :class:`LossTotals`, the aggregation denominators (mini-batch totals under gradient accumulation).
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Returns:
        :class:`HacpoLossOutput`; fp32, or fp64 for fp64 ``logp`` on the torch backend.
    """
    params = LossParams() if params is None else params
    totals = LossTotals() if totals is None else totals
    if not isinstance(params, LossParams):
        raise TypeError(f"params must be a LossParams, got {type(params).__name__}")
    if not isinstance(totals, LossTotals):
        raise TypeError(f"totals must be a LossTotals, got {type(totals).__name__}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be 2-D [B, T], got shape {tuple(logp.shape)}")
    n_rows, n_cols = logp.shape
    dev = logp.device
    _check_tensor(mask, "mask", (n_rows, n_cols), dev)
    token_level = params.token_level
    for name, vec in (("advantages", advantages), ("is_own", is_own), ("coef", coef)):
        _check_tensor(vec, name, (n_rows,), dev)
    if token_level:
        if old_logp is None or old_logp.shape != logp.shape or old_logp.device != dev:
            raise ValueError(f"ratio_level='token' needs old_logp of shape {tuple(logp.shape)} on {dev}")
    else:
        _check_tensor(old_logp_mean, "old_logp_mean", (n_rows,), dev)
    if params.kl_coef > 0 and ref_logp is None:
        raise ValueError(f"kl_coef = {params.kl_coef} > 0 needs ref_logp [B, T]")
    if ref_logp is not None:
        _check_tensor(ref_logp, "ref_logp", (n_rows, n_cols), dev)

    chosen = resolve_backend(backend, logp, _hacpo_fwd_kernel)
    if chosen == "triton":
        if logp.dtype not in FLOAT_DTYPES:
            raise ValueError(f"logp dtype {logp.dtype} is not supported by the triton backend (use one of "
                             f"{FLOAT_DTYPES}, or backend='auto'/'torch', which computes float64 on the twin)")
        loss, obj, ratio, stats, pg_loss, kl = _HacpoLossTriton.apply(
            _rowwise(logp), _rowwise(mask), _rowwise(old_logp) if token_level else None, _rowwise(ref_logp),
            advantages.contiguous(), old_logp_mean.contiguous() if not token_level else None,
            _as_loadable(is_own).contiguous(), coef.contiguous(), params, totals,
        )
        if token_level:
            ratio = None
    else:
        loss, obj, ratio, stats, pg_loss, kl = _hacpo_loss_torch(logp, mask, old_logp, ref_logp, advantages,
                                                                 old_logp_mean, is_own, coef, params, totals)
    return HacpoLossOutput(loss, obj, ratio, _metrics_from_stats(stats, pg_loss, kl), stats)
