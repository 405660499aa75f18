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
* KL (``kl_coef > 0``, ``ref_logp``): ``+ \beta\,\mathrm{KL}`` with the low-variance estimate
  ``k3 = e^{d} - d - 1``, ``d = \mathrm{clamp}(\log\pi_{ref} - \log\pi_\theta, \pm 20)``, on own tokens only,
  aggregated like the policy term (mean over own rows of per-row token means, or over own tokens);
  ``\partial k3/\partial\log\pi_\theta = 1 - e^{d}`` inside the clamp.

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

Metrics (0-d tensors, no device sync; names as in ``openrlhf_hacpo.algorithms.losses``):
``own_clip_frac_lower`` / ``own_clip_frac_upper`` (own units with ``s < 1-\epsilon_{low}`` / ``s > 1+\epsilon_{high}``),
``foreign_clip_frac_lower`` / ``foreign_clip_frac_upper`` / ``foreign_in_window_frac`` (foreign units with
``s < lo`` / ``s > hi`` / inside ``[lo, hi]``), ``own_ratio_mean`` / ``foreign_ratio_mean`` (mean ``s``), and the row
counts ``num_own`` / ``num_foreign``; ``foreign_pos_*`` the same window fractions among foreign units with
``A > 0``; ``pg_loss`` and ``kl`` (the two terms of the loss). A unit is a non-empty sequence (sequence level) or a
valid token (token level).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._utils import FLOAT_DTYPES, cdiv, is_interpreted, next_power_of_2, tl, triton
from .dispatch import resolve_backend

__all__ = [
    "hacpo_loss",
    "HacpoLossOutput",
    "cross_clip_lower_bound",
    "validate_loss_params",
    "METRIC_NAMES",
    "LOSS_AGGS",
    "RATIO_LEVELS",
    "LOG_RATIO_CLIP_MODES",
    "CROSS_CLIP_MODES",
    "FOREIGN_RULES",
    "KL_LOG_RATIO_LIMIT",
]

LOSS_AGGS = ("seq-mean-token-mean", "token-mean")
RATIO_LEVELS = ("sequence", "token")
LOG_RATIO_CLIP_MODES = ("symmetric", "upper")
CROSS_CLIP_MODES = ("clamp", "pessimistic")
FOREIGN_RULES = ("cross", "self_clip")
"""How foreign rows are trained: ``cross`` (HACPO, eqs. 10-14) or ``self_clip`` (Naive: the own-row GSPO clip)."""

KL_LOG_RATIO_LIMIT = 20.0
"""The k3 KL clamps ref_logp - logp to +-20 before exponentiating, so fp32 never overflows."""

# layout of the per-program partial sums
_S_LOSS, _S_ROWS, _S_TOKENS = 0, 1, 2
_S_OWN_N, _S_OWN_LOW, _S_OWN_HIGH, _S_OWN_RATIO = 3, 4, 5, 6
_S_FOR_N, _S_FOR_BELOW, _S_FOR_ABOVE, _S_FOR_RATIO = 7, 8, 9, 10
_S_OWN_ROWS, _S_FOR_ROWS = 11, 12
_S_KL, _S_OWN_TOKENS = 13, 14
_S_FPOS_N, _S_FPOS_BELOW, _S_FPOS_ABOVE = 15, 16, 17
_NUM_STATS = 18

METRIC_NAMES = (
    "pg_loss",
    "kl",
    "own_clip_frac_lower",
    "own_clip_frac_upper",
    "foreign_clip_frac_lower",
    "foreign_clip_frac_upper",
    "foreign_in_window_frac",
    "foreign_pos_clip_frac_lower",
    "foreign_pos_clip_frac_upper",
    "foreign_pos_in_window_frac",
    "own_ratio_mean",
    "foreign_ratio_mean",
    "num_own",
    "num_foreign",
)


class HacpoLossOutput(NamedTuple):
    """``loss`` 0-d (to minimise); ``objectives`` [B] detached per-row objectives; ``ratios`` [B] detached sequence
    ratios s after the log-ratio clamp (``None`` at token level); ``metrics`` 0-d tensors named in
    :data:`METRIC_NAMES`."""

    loss: torch.Tensor
    objectives: torch.Tensor
    ratios: torch.Tensor | None
    metrics: dict[str, torch.Tensor]


def cross_clip_lower_bound(delta: float, delta_step: float, update_index: int, stepwise: bool = True) -> float:
    """Lower end of the foreign-row ratio window: ``min(1, 1 - delta + m * delta_step)`` (eq. 14), or ``1 - delta``
    (eq. 13) when not stepwise."""
    if isinstance(update_index, bool) or int(update_index) != update_index or update_index < 0:
        raise ValueError(f"update_index must be an int >= 0, got {update_index!r}")
    if stepwise:
        return min(1.0, 1.0 - delta + int(update_index) * delta_step)
    return 1.0 - delta


def _fail(owner: str, name: str, rule: str, value) -> None:
    raise ValueError(f"{owner}.{name} must be {rule}, got {value!r}")


def _real(owner: str, name: str, value, *, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(owner, name, "a number", value)
    if not math.isfinite(value):
        _fail(owner, name, "finite", value)
    if minimum is not None and value < minimum:
        _fail(owner, name, f">= {minimum:g}", value)


def _choice(owner: str, name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(owner, name, f"one of {list(choices)}", value)


def validate_loss_params(owner: str = "hacpo_loss", *, eps_low: float, eps_high: float, delta: float,
                         delta_step: float, alpha: float, cross_clip_high: float, cross_clip_mode: str,
                         cross_clip_dual: float, log_ratio_clip: float | None, log_ratio_clip_mode: str,
                         ratio_level: str, loss_agg: str, kl_coef: float, foreign_rule: str = "cross") -> None:
    """The one set of rules for the loss hyperparameters (``PolicyLossConfig`` validates through it too).

    Raises ``ValueError("<owner>.<field> must be <rule>, got <value>")``.
    """
    for name, value in (("eps_low", eps_low), ("eps_high", eps_high), ("delta", delta), ("delta_step", delta_step),
                        ("alpha", alpha), ("kl_coef", kl_coef)):
        _real(owner, name, value, minimum=0.0)
    if eps_low >= 1:
        _fail(owner, "eps_low", "< 1", eps_low)
    if delta > 1:
        _fail(owner, "delta", "<= 1", delta)
    _real(owner, "cross_clip_high", cross_clip_high, minimum=1.0)
    _choice(owner, "cross_clip_mode", cross_clip_mode, CROSS_CLIP_MODES)
    _real(owner, "cross_clip_dual", cross_clip_dual)
    if not cross_clip_dual >= cross_clip_high:
        _fail(owner, "cross_clip_dual", f">= cross_clip_high ({cross_clip_high})", cross_clip_dual)
    if log_ratio_clip is not None:
        _real(owner, "log_ratio_clip", log_ratio_clip)
        if log_ratio_clip <= 0:
            _fail(owner, "log_ratio_clip", "> 0 or None", log_ratio_clip)
    _choice(owner, "log_ratio_clip_mode", log_ratio_clip_mode, LOG_RATIO_CLIP_MODES)
    _choice(owner, "ratio_level", ratio_level, RATIO_LEVELS)
    _choice(owner, "loss_agg", loss_agg, LOSS_AGGS)
    _choice(owner, "foreign_rule", foreign_rule, FOREIGN_RULES)


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
def _objective(s, adv, self_rule, coef, eps_low, eps_high, lo, hi, dual, alpha, CROSS_CLIP: tl.constexpr,
               CROSS_MIN: tl.constexpr):
    """Per-unit objective and d objective / d log-ratio (before the log-ratio clamp mask).

    ``self_rule`` is True for units trained with the own-row GSPO clip (own rows; every row under Naive)."""
    s_cl = tl.minimum(tl.maximum(s, 1.0 - eps_low), 1.0 + eps_high)
    own_obj = tl.minimum(s * adv, s_cl * adv)
    own_d = tl.where(s * adv <= s_cl * adv, s * adv, 0.0)
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
def _k3(lp, ref, kl_limit):
    """Low-variance KL per token, exp(d) - d - 1 with d = clamp(ref - lp, ±limit), and d k3 / d lp."""
    d = ref - lp
    d_c = tl.minimum(tl.maximum(d, -kl_limit), kl_limit)
    e = tl.exp(d_c)
    passes = ((d >= -kl_limit) & (d <= kl_limit)).to(tl.float32)
    return e - d_c - 1.0, (1.0 - e) * passes


@triton.jit
def _hacpo_fwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, old_mean_ptr, own_ptr, coef_ptr,
    obj_ptr, ratio_ptr, rowg_ptr, rowkl_ptr, partial_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, alpha_arg, clip_arg, kl_limit_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, TOKEN_MEAN: tl.constexpr,
    NUM_STATS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """BLOCK_B rows per program: masked sums over T tiles, per-row objective and gradient factors, partial sums."""
    pid = tl.program_id(0)
    eps_low = tl.cast(eps_low_arg, tl.float32)
    eps_high = tl.cast(eps_high_arg, tl.float32)
    lo = tl.cast(lo_arg, tl.float32)
    hi = tl.cast(hi_arg, tl.float32)
    dual = tl.cast(dual_arg, tl.float32)
    alpha = tl.cast(alpha_arg, tl.float32)
    clip_val = tl.cast(clip_arg, tl.float32)
    kl_limit = tl.cast(kl_limit_arg, tl.float32)

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
            k3, _dk3 = _k3(lp, ref.to(tl.float32), kl_limit)
            kl_acc += tl.sum(tl.where(own_tok, k3, 0.0), axis=1)
        if TOKEN_LEVEL:
            old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=valid, other=0.0).to(tl.float32)
            ell, _passes = _clip_log_ratio(lp - old, clip_val, CLIP_MODE)
            s = tl.exp(ell)
            obj_t, _d = _objective(s, adv[:, None], self_rule[:, None], coef[:, None], eps_low, eps_high, lo, hi,
                                   dual, alpha, CROSS_CLIP, CROSS_MIN)
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
        obj, dobj = _objective(s, adv, self_rule, coef, eps_low, eps_high, lo, hi, dual, alpha, CROSS_CLIP,
                               CROSS_MIN)
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

    tl.store(obj_ptr + rows64, obj, mask=row_ok)
    tl.store(rowg_ptr + rows64, rowg, mask=row_ok)
    base = partial_ptr + pid.to(tl.int64) * NUM_STATS
    tl.store(base + 0, tl.sum(tl.where(row_ok, loss_part, 0.0), axis=0))
    tl.store(base + 1, tl.sum(nonempty.to(tl.float32), axis=0))
    tl.store(base + 2, tl.sum(count, axis=0))
    tl.store(base + 3, tl.sum(own_units, axis=0))
    tl.store(base + 4, tl.sum(own_low, axis=0))
    tl.store(base + 5, tl.sum(own_high, axis=0))
    tl.store(base + 6, tl.sum(own_ratio, axis=0))
    tl.store(base + 7, tl.sum(for_units, axis=0))
    tl.store(base + 8, tl.sum(for_below, axis=0))
    tl.store(base + 9, tl.sum(for_above, axis=0))
    tl.store(base + 10, tl.sum(for_ratio, axis=0))
    tl.store(base + 11, tl.sum(own_rows.to(tl.float32), axis=0))
    tl.store(base + 12, tl.sum((nonempty & (own == 0)).to(tl.float32), axis=0))
    tl.store(base + 13, tl.sum(tl.where(row_ok, kl_part, 0.0), axis=0))
    tl.store(base + 14, tl.sum(tl.where(own, count, 0.0), axis=0))
    tl.store(base + 15, tl.sum(tl.where(positive, for_units, 0.0), axis=0))
    tl.store(base + 16, tl.sum(tl.where(positive, for_below, 0.0), axis=0))
    tl.store(base + 17, tl.sum(tl.where(positive, for_above, 0.0), axis=0))


@triton.jit
def _hacpo_bwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, own_ptr, coef_ptr, rowg_ptr, rowkl_ptr, scale_ptr, grad_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref, stride_g,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, alpha_arg, clip_arg, kl_limit_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
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
                                lo, hi, dual, alpha, CROSS_CLIP, CROSS_MIN)
        g = pg_scale * dobj * passes * rowg[:, None]
    else:
        g = tl.zeros([BLOCK_B, BLOCK_T], dtype=tl.float32) + pg_scale * rowg[:, None]
    if HAS_KL:
        kl_scale = tl.load(scale_ptr + 1).to(tl.float32)
        kl_limit = tl.cast(kl_limit_arg, tl.float32)
        own_tok = valid & own[:, None]
        ref = tl.load(ref_ptr + rows64[:, None] * stride_ref + t[None, :], mask=own_tok, other=0.0).to(tl.float32)
        _k, dk3 = _k3(lp, ref, kl_limit)
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


def _denominators(stats: torch.Tensor, hp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(D, D_kl): the policy-gradient and KL aggregation denominators (given mini-batch totals, else counted)."""
    def pick(given, counted):
        if given is not None:
            return torch.full((), float(given), dtype=stats.dtype, device=stats.device)
        return counted.clamp(min=1.0)

    if hp["token_mean"]:
        return (pick(hp["num_tokens"], stats[_S_TOKENS]),
                pick(hp["num_own_tokens"], stats[_S_OWN_TOKENS]).clamp(min=1.0))
    return pick(hp["num_seqs"], stats[_S_ROWS]), pick(hp["num_own_seqs"], stats[_S_OWN_ROWS]).clamp(min=1.0)


class _HacpoLossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, hp):
        n_rows, n_cols = logp.shape
        dev = logp.device
        block_b, block_t, warps = _tile(False, n_rows, n_cols)
        n_prog = max(cdiv(n_rows, block_b), 1)
        obj = torch.empty(n_rows, dtype=torch.float32, device=dev)
        ratio = torch.zeros(n_rows, dtype=torch.float32, device=dev)
        rowg = torch.empty(n_rows, dtype=torch.float32, device=dev)
        rowkl = torch.zeros(n_rows, dtype=torch.float32, device=dev)
        partials = torch.empty((n_prog, _NUM_STATS), dtype=torch.float32, device=dev)
        old_arg = old_logp if old_logp is not None else logp
        ref_arg = ref_logp if ref_logp is not None else logp
        old_mean_arg = old_mean if old_mean is not None else adv
        if n_rows == 0:
            partials.zero_()
        else:
            _hacpo_fwd_kernel[(n_prog,)](
                logp, mask, old_arg, ref_arg, adv, old_mean_arg, own, coef, obj, ratio, rowg, rowkl, partials,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), ref_arg.stride(0),
                hp["eps_low"], hp["eps_high"], hp["lo"], hp["hi"], hp["dual"], hp["alpha"], hp["clip_val"],
                KL_LOG_RATIO_LIMIT,
                TOKEN_LEVEL=hp["token_level"], CLIP_MODE=hp["clip_mode"], CROSS_CLIP=hp["cross_clip"],
                CROSS_MIN=hp["cross_min"], FOREIGN_SELF=hp["foreign_self"], HAS_KL=hp["has_kl"],
                TOKEN_MEAN=hp["token_mean"], NUM_STATS=_NUM_STATS, BLOCK_B=block_b, BLOCK_T=block_t,
                num_warps=warps,
            )
        stats = partials.sum(dim=0) if n_prog > 1 else partials[0]
        denom, kl_denom = _denominators(stats, hp)
        pg_loss = -stats[_S_LOSS] / denom
        kl = stats[_S_KL] / kl_denom
        loss = pg_loss + hp["kl_coef"] * kl
        ctx.save_for_backward(logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, denom, kl_denom)
        ctx.hp = hp
        ctx.mark_non_differentiable(obj, ratio, stats, pg_loss, kl)
        return loss, obj, ratio, stats, pg_loss, kl

    @staticmethod
    def backward(ctx, dloss, *_unused):
        logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, denom, kl_denom = ctx.saved_tensors
        hp = ctx.hp
        n_rows, n_cols = logp.shape
        grad = torch.empty((n_rows, n_cols), dtype=logp.dtype, device=logp.device)
        if dloss is None:
            return (grad.zero_(),) + (None,) * 8
        scales = torch.stack([-dloss / denom, dloss * hp["kl_coef"] / kl_denom]).to(torch.float32)
        block_b, block_t, warps = _tile(True, n_rows, n_cols)
        if n_rows and n_cols:
            _hacpo_bwd_kernel[(cdiv(n_rows, block_b), cdiv(n_cols, block_t))](
                logp, mask, old_arg, ref_arg, adv, own, coef, rowg, rowkl, scales, grad,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), ref_arg.stride(0),
                grad.stride(0),
                hp["eps_low"], hp["eps_high"], hp["lo"], hp["hi"], hp["dual"], hp["alpha"], hp["clip_val"],
                KL_LOG_RATIO_LIMIT,
                TOKEN_LEVEL=hp["token_level"], CLIP_MODE=hp["clip_mode"], CROSS_CLIP=hp["cross_clip"],
                CROSS_MIN=hp["cross_min"], FOREIGN_SELF=hp["foreign_self"], HAS_KL=hp["has_kl"],
                BLOCK_B=block_b, BLOCK_T=block_t, num_warps=warps,
            )
        return (grad,) + (None,) * 8


# --------------------------------------------------------------------------------------------------------------
# torch twin (plain differentiable torch ops): the algorithm core of eqs. 6-14 and 47-53 on the CPU
# --------------------------------------------------------------------------------------------------------------
def _hacpo_loss_torch(logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, hp):
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
    self_rule = torch.ones_like(own) if hp["foreign_self"] else own
    token_level = hp["token_level"]
    if token_level:
        ell = torch.where(valid, lp - old_logp.to(cdt), zero)
        a, o, w = adv[:, None], self_rule[:, None], coef[:, None]
    else:
        ell = lp.sum(dim=-1) / safe_count - old_mean.to(cdt)
        a, o, w = adv, self_rule, coef
    if hp["clip_mode"] == 1:
        ell = ell.clamp(-hp["clip_val"], hp["clip_val"])
    elif hp["clip_mode"] == 2:
        ell = ell.clamp(max=hp["clip_val"])
    s = ell.exp()
    # own rows (and every row under Naive): min(s·A, clip(s, 1 - eps_low, 1 + eps_high)·A)   (eqs. 47-49)
    own_obj = torch.minimum(s * a, s.clamp(1.0 - hp["eps_low"], 1.0 + hp["eps_high"]) * a)
    # foreign rows: c·sg(c)^α·ω·A with c = clamp(s, lo_m, hi)                                  (eqs. 10-14, 50-52)
    c = s.clamp(hp["lo"], hp["hi"]) if hp["cross_clip"] else s
    weight = c.detach().pow(hp["alpha"]) * w
    if hp["cross_min"]:
        pess = torch.minimum(s * a, c * a)
        for_obj = torch.where((a < 0) & (hp["dual"] * a > pess), hp["dual"] * a, pess) * weight
    else:
        for_obj = c * weight * a
    unit_obj = torch.where(o, own_obj, for_obj)
    if token_level:
        unit_obj = torch.where(valid, unit_obj, zero)
        obj = unit_obj.sum(dim=-1) / safe_count
        loss_sum = unit_obj.sum() if hp["token_mean"] else obj.sum()
        own_u, for_u = valid & own[:, None], valid & ~own[:, None]
        positive = (adv > 0)[:, None]
        ratio = None
    else:
        obj = torch.where(nonempty, unit_obj, torch.zeros_like(unit_obj))
        loss_sum = (obj * count).sum() if hp["token_mean"] else obj.sum()
        own_u, for_u = nonempty & own, nonempty & ~own
        positive = adv > 0
        ratio = torch.where(nonempty, s.detach(), torch.zeros_like(s))
    # low-variance KL (k3) to the reference policy on own tokens
    kl_sum = zero
    if hp["has_kl"]:
        own_tok = valid & own[:, None]
        d = torch.where(own_tok, ref_logp.to(cdt) - lp, zero).clamp(-KL_LOG_RATIO_LIMIT, KL_LOG_RATIO_LIMIT)
        k3 = torch.where(own_tok, d.exp() - d - 1.0, zero).sum(dim=-1)
        kl_sum = k3.sum() if hp["token_mean"] else (k3 / safe_count).sum()
    sd = s.detach()
    fpos = for_u & positive
    stats = torch.stack([
        loss_sum.detach(),
        nonempty.sum().to(cdt),
        count.sum(),
        own_u.sum().to(cdt),
        (own_u & (sd < 1.0 - hp["eps_low"])).sum().to(cdt),
        (own_u & (sd > 1.0 + hp["eps_high"])).sum().to(cdt),
        torch.where(own_u, sd, torch.zeros_like(sd)).sum(),
        for_u.sum().to(cdt),
        (for_u & (sd < hp["lo"])).sum().to(cdt),
        (for_u & (sd > hp["hi"])).sum().to(cdt),
        torch.where(for_u, sd, torch.zeros_like(sd)).sum(),
        (nonempty & own).sum().to(cdt),
        (nonempty & ~own).sum().to(cdt),
        kl_sum.detach(),
        torch.where(own, count, zero).sum(),
        fpos.sum().to(cdt),
        (fpos & (sd < hp["lo"])).sum().to(cdt),
        (fpos & (sd > hp["hi"])).sum().to(cdt),
    ])
    denom, kl_denom = _denominators(stats, hp)
    pg_loss = -loss_sum / denom
    kl = kl_sum / kl_denom
    loss = pg_loss + hp["kl_coef"] * kl
    return loss, obj.detach(), ratio, stats, pg_loss.detach(), kl.detach()


# --------------------------------------------------------------------------------------------------------------
# public function
# --------------------------------------------------------------------------------------------------------------
_RATIO_METRICS = {
    # name: (numerator as {stat: weight}, denominator stat or None for 1); a denominator is clamped to >= 1
    "own_clip_frac_lower": ({_S_OWN_LOW: 1}, _S_OWN_N),
    "own_clip_frac_upper": ({_S_OWN_HIGH: 1}, _S_OWN_N),
    "foreign_clip_frac_lower": ({_S_FOR_BELOW: 1}, _S_FOR_N),
    "foreign_clip_frac_upper": ({_S_FOR_ABOVE: 1}, _S_FOR_N),
    "foreign_in_window_frac": ({_S_FOR_N: 1, _S_FOR_BELOW: -1, _S_FOR_ABOVE: -1}, _S_FOR_N),
    "foreign_pos_clip_frac_lower": ({_S_FPOS_BELOW: 1}, _S_FPOS_N),
    "foreign_pos_clip_frac_upper": ({_S_FPOS_ABOVE: 1}, _S_FPOS_N),
    "foreign_pos_in_window_frac": ({_S_FPOS_N: 1, _S_FPOS_BELOW: -1, _S_FPOS_ABOVE: -1}, _S_FPOS_N),
    "own_ratio_mean": ({_S_OWN_RATIO: 1}, _S_OWN_N),
    "foreign_ratio_mean": ({_S_FOR_RATIO: 1}, _S_FOR_N),
    "num_own": ({_S_OWN_ROWS: 1}, None),
    "num_foreign": ({_S_FOR_ROWS: 1}, None),
}
"""Every logged statistic is (a signed sum of counters) / max(a counter, 1): the in-window fraction is
(n - below - above) / max(n, 1), which is 0 when no unit of the kind exists."""
_metric_weights_cache: dict = {}


def _metric_weights(device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """([2, K, S] numerator/denominator weights, [K] denominator offset) on ``device``, built once per device."""
    key = (str(device), dtype)
    if key not in _metric_weights_cache:
        weights = torch.zeros(2, len(_RATIO_METRICS), _NUM_STATS, dtype=dtype)
        offset = torch.zeros(len(_RATIO_METRICS), dtype=dtype)
        for k, (numerator, denominator) in enumerate(_RATIO_METRICS.values()):
            for stat, w in numerator.items():
                weights[0, k, stat] = w
            if denominator is None:
                offset[k] = 1.0
            else:
                weights[1, k, denominator] = 1.0
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


def _check_tensor(x: torch.Tensor | None, name: str, shape: tuple[int, ...], device) -> None:
    if x is None:
        raise ValueError(f"{name} is required")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device}")


def _check_count(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def hacpo_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logp_mean: torch.Tensor | None,
    is_own: torch.Tensor,
    coef: torch.Tensor,
    *,
    update_index: int = 0,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    delta: float = 0.2,
    delta_step: float = 0.025,
    alpha: float = 1.0,
    stepwise: bool = True,
    cross_clip: bool = True,
    cross_clip_high: float = 1.0,
    cross_clip_mode: str = "clamp",
    cross_clip_dual: float = 3.0,
    foreign_rule: str = "cross",
    log_ratio_clip: float | None = 10.0,
    log_ratio_clip_mode: str = "symmetric",
    ratio_level: str = "sequence",
    old_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    loss_agg: str = "seq-mean-token-mean",
    num_seqs: int | None = None,
    num_tokens: int | None = None,
    num_own_seqs: int | None = None,
    num_own_tokens: int | None = None,
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
        update_index: ``m``, optimizer steps already taken in this training step (eq. 14).
        eps_low, eps_high: own-row clip range ``[1 - eps_low, 1 + eps_high]``.
        delta, delta_step: foreign window ``[min(1, 1 - delta + m * delta_step), 1]``.
        alpha: exponential importance-sampling power (eq. 12), ``>= 0``.
        stepwise: tighten the foreign window with ``m`` (otherwise ``[1 - delta, 1]``).
        cross_clip: clamp foreign ratios to the window (``False``: no clamp, ablation "no Clip").
        cross_clip_high: upper end of the foreign window (1 in the paper; ``>= 1``).
        cross_clip_mode: ``"clamp"`` (paper) or ``"pessimistic"`` (``min(s A, c A) sg(c)^alpha omega``: positive
            advantages below the window and negative ones above it keep their gradient).
        cross_clip_dual: pessimistic mode: negative-advantage foreign units with ``s > cross_clip_dual`` get no
            gradient (dual clip, ``>= cross_clip_high``).
        foreign_rule: ``"cross"`` (HACPO, the rules above) or ``"self_clip"`` (Naive: foreign rows use the own-row
            clip, ``coef`` is ignored; the foreign metrics then use the window ``[1 - eps_low, 1 + eps_high]``).
        log_ratio_clip: clamp of the log-ratio, ``None`` for none.
        log_ratio_clip_mode: ``"symmetric"`` (``[-C, C]``) or ``"upper"`` (``<= C``).
        ratio_level: ``"sequence"`` (GSPO) or ``"token"`` (needs ``old_logp``).
        old_logp: ``[B, T]`` old token log-probs on the same tokens (token level only).
        kl_coef, ref_logp: weight and ``[B, T]`` reference log-probs of the low-variance (k3) KL on own tokens,
            ``exp(d) - d - 1`` with ``d = clamp(ref - logp, ±20)``, aggregated like the policy term over own rows
            (``num_own_seqs``) or own tokens (``num_own_tokens``); the metric ``kl`` is reported whenever
            ``ref_logp`` is given.
        loss_agg: ``"seq-mean-token-mean"`` or ``"token-mean"``.
        num_seqs, num_tokens, num_own_seqs, num_own_tokens: aggregation denominators (mini-batch totals under
            gradient accumulation); ``None`` counts this micro-batch.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Returns:
        :class:`HacpoLossOutput`; fp32, or fp64 for fp64 ``logp`` on the torch backend.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be 2-D [B, T], got shape {tuple(logp.shape)}")
    n_rows, n_cols = logp.shape
    dev = logp.device
    _check_tensor(mask, "mask", (n_rows, n_cols), dev)
    validate_loss_params("hacpo_loss", eps_low=eps_low, eps_high=eps_high, delta=delta, delta_step=delta_step,
                         alpha=alpha, cross_clip_high=cross_clip_high, cross_clip_mode=cross_clip_mode,
                         cross_clip_dual=cross_clip_dual, log_ratio_clip=log_ratio_clip,
                         log_ratio_clip_mode=log_ratio_clip_mode, ratio_level=ratio_level, loss_agg=loss_agg,
                         kl_coef=kl_coef, foreign_rule=foreign_rule)
    token_level = ratio_level == "token"
    for name, vec in (("advantages", advantages), ("is_own", is_own), ("coef", coef)):
        _check_tensor(vec, name, (n_rows,), dev)
    if token_level:
        if old_logp is None or old_logp.shape != logp.shape or old_logp.device != dev:
            raise ValueError(f"ratio_level='token' needs old_logp of shape {tuple(logp.shape)} on {dev}")
    else:
        _check_tensor(old_logp_mean, "old_logp_mean", (n_rows,), dev)
    if kl_coef > 0 and ref_logp is None:
        raise ValueError(f"kl_coef = {kl_coef} > 0 needs ref_logp [B, T]")
    if ref_logp is not None:
        _check_tensor(ref_logp, "ref_logp", (n_rows, n_cols), dev)
    for name, val in (("num_seqs", num_seqs), ("num_tokens", num_tokens), ("num_own_seqs", num_own_seqs),
                      ("num_own_tokens", num_own_tokens)):
        _check_count(name, val)

    self_rule = foreign_rule == "self_clip"
    lo = cross_clip_lower_bound(delta, delta_step, update_index, stepwise)
    hp = {
        "eps_low": float(eps_low),
        "eps_high": float(eps_high),
        # Naive reports its foreign rows against its own clip window
        "lo": 1.0 - float(eps_low) if self_rule else float(lo),
        "hi": 1.0 + float(eps_high) if self_rule else float(cross_clip_high),
        "dual": float(cross_clip_dual),
        "alpha": float(alpha),
        "clip_val": float(log_ratio_clip) if log_ratio_clip is not None else 0.0,
        "clip_mode": 0 if log_ratio_clip is None else (1 if log_ratio_clip_mode == "symmetric" else 2),
        "cross_clip": bool(cross_clip),
        "cross_min": bool(cross_clip) and cross_clip_mode == "pessimistic",
        "foreign_self": self_rule,
        "has_kl": ref_logp is not None,
        "kl_coef": float(kl_coef),
        "token_level": token_level,
        "token_mean": loss_agg == "token-mean",
        "num_seqs": num_seqs,
        "num_tokens": num_tokens,
        "num_own_seqs": num_own_seqs,
        "num_own_tokens": num_own_tokens,
    }
    chosen = resolve_backend(backend, logp, _hacpo_fwd_kernel)
    if chosen == "triton":
        if logp.dtype not in FLOAT_DTYPES:
            raise ValueError(f"logp dtype {logp.dtype} is not supported by the triton backend (use one of "
                             f"{FLOAT_DTYPES}, or backend='auto'/'torch', which computes float64 on the twin)")
        loss, obj, ratio, stats, pg_loss, kl = _HacpoLossTriton.apply(
            _rowwise(logp), _rowwise(mask), _rowwise(old_logp) if token_level else None, _rowwise(ref_logp),
            advantages.contiguous(), old_logp_mean.contiguous() if not token_level else None,
            _as_loadable(is_own).contiguous(), coef.contiguous(), hp,
        )
        if token_level:
            ratio = None
    else:
        loss, obj, ratio, stats, pg_loss, kl = _hacpo_loss_torch(logp, mask, old_logp, ref_logp, advantages,
                                                                 old_logp_mean, is_own, coef, hp)
    return HacpoLossOutput(loss, obj, ratio, _metrics_from_stats(stats, pg_loss, kl))
