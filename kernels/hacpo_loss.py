r"""HACPO / GSPO policy loss on ``[B, T]`` token log-probs: one Triton launch forward, one backward.

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
counts ``num_own`` / ``num_foreign``; a unit is a non-empty sequence (sequence level) or a valid token (token level).
"""
from __future__ import annotations

import torch

from ._utils import cdiv, next_power_of_2, tl, triton
from .dispatch import resolve_backend

__all__ = ["hacpo_loss", "cross_clip_lower_bound", "METRIC_NAMES", "LOSS_AGGS", "RATIO_LEVELS", "CLIP_MODES"]

LOSS_AGGS = ("seq-mean-token-mean", "token-mean")
RATIO_LEVELS = ("sequence", "token")
CLIP_MODES = ("symmetric", "upper")
CROSS_CLIP_MODES = ("clamp", "pessimistic")

# layout of the per-program partial sums
_S_LOSS, _S_ROWS, _S_TOKENS = 0, 1, 2
_S_OWN_N, _S_OWN_LOW, _S_OWN_HIGH, _S_OWN_RATIO = 3, 4, 5, 6
_S_FOR_N, _S_FOR_BELOW, _S_FOR_ABOVE, _S_FOR_RATIO = 7, 8, 9, 10
_S_OWN_ROWS, _S_FOR_ROWS = 11, 12
_NUM_STATS = 13

METRIC_NAMES = (
    "own_clip_frac_lower",
    "own_clip_frac_upper",
    "foreign_clip_frac_lower",
    "foreign_clip_frac_upper",
    "foreign_in_window_frac",
    "own_ratio_mean",
    "foreign_ratio_mean",
    "num_own",
    "num_foreign",
)


def cross_clip_lower_bound(delta: float, delta_step: float, update_index: int, stepwise: bool = True) -> float:
    """Lower end of the foreign-row ratio window: ``min(1, 1 - delta + m * delta_step)`` (eq. 14), or ``1 - delta``."""
    if stepwise:
        return min(1.0, 1.0 - delta + update_index * delta_step)
    return 1.0 - delta


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
def _objective(s, adv, own, coef, eps_low, eps_high, lo, hi, dual, alpha, CROSS_CLIP: tl.constexpr,
               CROSS_MIN: tl.constexpr):
    """Per-unit objective and d objective / d log-ratio (before the log-ratio clamp mask)."""
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
    obj = tl.where(own, own_obj, for_obj)
    dobj = tl.where(own, own_d, for_d)
    return obj, dobj


@triton.jit
def _hacpo_fwd_kernel(
    logp_ptr, mask_ptr, old_ptr, adv_ptr, old_mean_ptr, own_ptr, coef_ptr,
    obj_ptr, rowg_ptr, partial_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, alpha_arg, clip_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    TOKEN_MEAN: tl.constexpr,
    NUM_STATS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """BLOCK_B rows per program: masked sums over T tiles, per-row objective and gradient factor, partial sums."""
    pid = tl.program_id(0)
    eps_low = tl.cast(eps_low_arg, tl.float32)
    eps_high = tl.cast(eps_high_arg, tl.float32)
    lo = tl.cast(lo_arg, tl.float32)
    hi = tl.cast(hi_arg, tl.float32)
    dual = tl.cast(dual_arg, tl.float32)
    alpha = tl.cast(alpha_arg, tl.float32)
    clip_val = tl.cast(clip_arg, tl.float32)

    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    adv = tl.load(adv_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
    own = tl.load(own_ptr + rows64, mask=row_ok, other=0) != 0
    coef = tl.load(coef_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
    cols = tl.arange(0, BLOCK_T)

    count = tl.zeros([BLOCK_B], dtype=tl.float32)
    acc = tl.zeros([BLOCK_B], dtype=tl.float32)  # sum of logp (sequence level) or of token objectives (token level)
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
        if TOKEN_LEVEL:
            old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=valid, other=0.0).to(tl.float32)
            ell, _passes = _clip_log_ratio(lp - old, clip_val, CLIP_MODE)
            s = tl.exp(ell)
            obj_t, _d = _objective(s, adv[:, None], own[:, None], coef[:, None], eps_low, eps_high, lo, hi, dual,
                                   alpha, CROSS_CLIP, CROSS_MIN)
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
        obj, dobj = _objective(s, adv, own, coef, eps_low, eps_high, lo, hi, dual, alpha, CROSS_CLIP, CROSS_MIN)
        obj = tl.where(nonempty, obj, 0.0)
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
    tl.store(base + 11, tl.sum((nonempty & own).to(tl.float32), axis=0))
    tl.store(base + 12, tl.sum((nonempty & (own == 0)).to(tl.float32), axis=0))


@triton.jit
def _hacpo_bwd_kernel(
    logp_ptr, mask_ptr, old_ptr, adv_ptr, own_ptr, coef_ptr, rowg_ptr, dloss_ptr, denom_ptr, grad_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_g,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, alpha_arg, clip_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """d loss / d logp[i, t] = -(dloss / D) * mask * (row factor [* d o_t / d ell_t at token level])."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    in_bounds = row_ok[:, None] & (t[None, :] < n_cols)
    scale = -tl.load(dloss_ptr).to(tl.float32) / tl.load(denom_ptr).to(tl.float32)
    valid = tl.load(mask_ptr + rows64[:, None] * stride_mk + t[None, :], mask=in_bounds, other=0) != 0
    valid = valid & in_bounds
    rowg = tl.load(rowg_ptr + rows64, mask=row_ok, other=0.0)
    if TOKEN_LEVEL:
        eps_low = tl.cast(eps_low_arg, tl.float32)
        eps_high = tl.cast(eps_high_arg, tl.float32)
        lo = tl.cast(lo_arg, tl.float32)
        hi = tl.cast(hi_arg, tl.float32)
        dual = tl.cast(dual_arg, tl.float32)
        alpha = tl.cast(alpha_arg, tl.float32)
        clip_val = tl.cast(clip_arg, tl.float32)
        adv = tl.load(adv_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        own = tl.load(own_ptr + rows64, mask=row_ok, other=0) != 0
        coef = tl.load(coef_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        lp = tl.load(logp_ptr + rows64[:, None] * stride_lp + t[None, :], mask=valid, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=valid, other=0.0).to(tl.float32)
        ell, passes = _clip_log_ratio(lp - old, clip_val, CLIP_MODE)
        _obj, dobj = _objective(tl.exp(ell), adv[:, None], own[:, None], coef[:, None], eps_low, eps_high, lo, hi,
                                dual, alpha, CROSS_CLIP, CROSS_MIN)
        g = dobj * passes * rowg[:, None]
    else:
        g = tl.zeros([BLOCK_B, BLOCK_T], dtype=tl.float32) + rowg[:, None]
    grad = tl.where(valid, scale * g, 0.0)
    tl.store(grad_ptr + rows64[:, None] * stride_g + t[None, :], grad.to(grad_ptr.dtype.element_ty), mask=in_bounds)


_BLOCK_B = 16
_BLOCK_T = 128


def _as_loadable(x: torch.Tensor) -> torch.Tensor:
    """Bool tensors are handed to Triton as uint8 (same bytes, no copy)."""
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def _rowwise(x: torch.Tensor) -> torch.Tensor:
    x = _as_loadable(x)
    return x if x.stride(-1) == 1 else x.contiguous()


class _HacpoLossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, mask, old_logp, adv, old_mean, own, coef, hp):
        n_rows, n_cols = logp.shape
        dev = logp.device
        block_b = min(_BLOCK_B, max(next_power_of_2(n_rows), 1))
        block_t = min(_BLOCK_T, max(next_power_of_2(n_cols), 16))
        n_prog = max(cdiv(n_rows, block_b), 1)
        obj = torch.empty(n_rows, dtype=torch.float32, device=dev)
        rowg = torch.empty(n_rows, dtype=torch.float32, device=dev)
        partials = torch.empty((n_prog, _NUM_STATS), dtype=torch.float32, device=dev)
        old_arg = old_logp if old_logp is not None else logp
        old_mean_arg = old_mean if old_mean is not None else adv
        if n_rows == 0:
            partials.zero_()
        else:
            _hacpo_fwd_kernel[(n_prog,)](
                logp, mask, old_arg, adv, old_mean_arg, own, coef, obj, rowg, partials,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0),
                hp["eps_low"], hp["eps_high"], hp["lo"], hp["hi"], hp["dual"], hp["alpha"], hp["clip_val"],
                TOKEN_LEVEL=hp["token_level"], CLIP_MODE=hp["clip_mode"], CROSS_CLIP=hp["cross_clip"],
                CROSS_MIN=hp["cross_min"],
                TOKEN_MEAN=hp["token_mean"], NUM_STATS=_NUM_STATS, BLOCK_B=block_b, BLOCK_T=block_t,
                num_warps=4,
            )
        stats = partials.sum(dim=0) if n_prog > 1 else partials[0]
        denom = _denominator(stats, hp)
        loss = -stats[_S_LOSS] / denom
        ctx.save_for_backward(logp, mask, old_arg, adv, own, coef, rowg, denom)
        ctx.hp = hp
        ctx.blocks = (block_b, block_t)
        ctx.mark_non_differentiable(obj, stats)
        return loss, obj, stats

    @staticmethod
    def backward(ctx, dloss, _dobj, _dstats):
        logp, mask, old_arg, adv, own, coef, rowg, denom = ctx.saved_tensors
        hp = ctx.hp
        n_rows, n_cols = logp.shape
        grad = torch.empty((n_rows, n_cols), dtype=logp.dtype, device=logp.device)
        if dloss is None:
            return (grad.zero_(),) + (None,) * 7
        block_b, block_t = ctx.blocks
        if n_rows and n_cols:
            _hacpo_bwd_kernel[(cdiv(n_rows, block_b), cdiv(n_cols, block_t))](
                logp, mask, old_arg, adv, own, coef, rowg, dloss.reshape(1).contiguous(), denom.reshape(1), grad,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), grad.stride(0),
                hp["eps_low"], hp["eps_high"], hp["lo"], hp["hi"], hp["dual"], hp["alpha"], hp["clip_val"],
                TOKEN_LEVEL=hp["token_level"], CLIP_MODE=hp["clip_mode"], CROSS_CLIP=hp["cross_clip"],
                CROSS_MIN=hp["cross_min"],
                BLOCK_B=block_b, BLOCK_T=block_t, num_warps=4,
            )
        return (grad,) + (None,) * 7


def _denominator(stats: torch.Tensor, hp: dict) -> torch.Tensor:
    if hp["token_mean"]:
        given, counted = hp["num_tokens"], stats[_S_TOKENS]
    else:
        given, counted = hp["num_seqs"], stats[_S_ROWS]
    if given is not None:
        return torch.full((), float(given), dtype=stats.dtype, device=stats.device)
    return counted.clamp(min=1.0)


# --------------------------------------------------------------------------------------------------------------
# torch twin (plain differentiable torch ops)
# --------------------------------------------------------------------------------------------------------------
def _hacpo_loss_torch(logp, mask, old_logp, adv, old_mean, own, coef, hp):
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
    token_level = hp["token_level"]
    if token_level:
        ell = torch.where(valid, lp - old_logp.to(cdt), zero)
        a, o, w = adv[:, None], own[:, None], coef[:, None]
    else:
        ell = lp.sum(dim=-1) / safe_count - old_mean.to(cdt)
        a, o, w = adv, own, coef
    if hp["clip_mode"] == 1:
        ell = ell.clamp(-hp["clip_val"], hp["clip_val"])
    elif hp["clip_mode"] == 2:
        ell = ell.clamp(max=hp["clip_val"])
    s = ell.exp()
    own_obj = torch.minimum(s * a, s.clamp(1.0 - hp["eps_low"], 1.0 + hp["eps_high"]) * a)
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
        own_u, for_u = valid & o, valid & ~o
    else:
        obj = torch.where(nonempty, unit_obj, torch.zeros_like(unit_obj))
        loss_sum = (obj * count).sum() if hp["token_mean"] else obj.sum()
        own_u, for_u = nonempty & own, nonempty & ~own
    sd = s.detach()
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
    ])
    loss = -loss_sum / _denominator(stats, hp)
    return loss, obj.detach(), stats


# --------------------------------------------------------------------------------------------------------------
# public function
# --------------------------------------------------------------------------------------------------------------
def _metrics_from_stats(stats: torch.Tensor) -> dict[str, torch.Tensor]:
    own_n = stats[_S_OWN_N]
    for_n = stats[_S_FOR_N]
    own_d = own_n.clamp(min=1.0)
    for_d = for_n.clamp(min=1.0)
    below = stats[_S_FOR_BELOW] / for_d
    above = stats[_S_FOR_ABOVE] / for_d
    return {
        "own_clip_frac_lower": stats[_S_OWN_LOW] / own_d,
        "own_clip_frac_upper": stats[_S_OWN_HIGH] / own_d,
        "foreign_clip_frac_lower": below,
        "foreign_clip_frac_upper": above,
        "foreign_in_window_frac": torch.where(for_n > 0, 1.0 - below - above, torch.zeros_like(below)),
        "own_ratio_mean": stats[_S_OWN_RATIO] / own_d,
        "foreign_ratio_mean": stats[_S_FOR_RATIO] / for_d,
        "num_own": stats[_S_OWN_ROWS],
        "num_foreign": stats[_S_FOR_ROWS],
    }


def _check_row_vector(x: torch.Tensor | None, name: str, n_rows: int, device) -> None:
    if x is None:
        raise ValueError(f"{name} is required")
    if x.dim() != 1 or x.shape[0] != n_rows:
        raise ValueError(f"{name} must have shape [{n_rows}], got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, expected {device}")


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
    log_ratio_clip: float | None = 10.0,
    log_ratio_clip_mode: str = "symmetric",
    ratio_level: str = "sequence",
    old_logp: torch.Tensor | None = None,
    loss_agg: str = "seq-mean-token-mean",
    num_seqs: int | None = None,
    num_tokens: int | None = None,
    backend: str = "auto",
):
    """HACPO loss for one learner on a micro-batch of ``B`` sequences (formulas in the module docstring).

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
        log_ratio_clip: clamp of the log-ratio, ``None`` for none.
        log_ratio_clip_mode: ``"symmetric"`` (``[-C, C]``) or ``"upper"`` (``<= C``).
        ratio_level: ``"sequence"`` (GSPO) or ``"token"`` (needs ``old_logp``).
        old_logp: ``[B, T]`` old token log-probs on the same tokens (token level only).
        loss_agg: ``"seq-mean-token-mean"`` or ``"token-mean"``.
        num_seqs, num_tokens: aggregation denominators (mini-batch totals under gradient accumulation).
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.

    Returns:
        ``(loss 0-d, objectives [B] detached, metrics dict of 0-d tensors)``; fp32, or fp64 for fp64 ``logp`` on
        the torch backend.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be 2-D [B, T], got shape {tuple(logp.shape)}")
    n_rows, n_cols = logp.shape
    dev = logp.device
    if mask.shape != logp.shape:
        raise ValueError(f"mask must have shape {tuple(logp.shape)}, got {tuple(mask.shape)}")
    if mask.device != dev:
        raise ValueError(f"mask is on {mask.device}, expected {dev}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")
    if log_ratio_clip_mode not in CLIP_MODES:
        raise ValueError(f"log_ratio_clip_mode must be one of {CLIP_MODES}, got {log_ratio_clip_mode!r}")
    token_level = ratio_level == "token"
    for name, vec in (("advantages", advantages), ("is_own", is_own), ("coef", coef)):
        _check_row_vector(vec, name, n_rows, dev)
    if token_level:
        if old_logp is None or old_logp.shape != logp.shape or old_logp.device != dev:
            raise ValueError(f"ratio_level='token' needs old_logp of shape {tuple(logp.shape)} on {dev}")
    else:
        _check_row_vector(old_logp_mean, "old_logp_mean", n_rows, dev)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if cross_clip_mode not in CROSS_CLIP_MODES:
        raise ValueError(f"cross_clip_mode must be one of {CROSS_CLIP_MODES}, got {cross_clip_mode!r}")
    if not cross_clip_high >= 1.0:
        raise ValueError(f"cross_clip_high must be >= 1, got {cross_clip_high}")
    if not cross_clip_dual >= cross_clip_high:
        raise ValueError(f"cross_clip_dual must be >= cross_clip_high ({cross_clip_high}), got {cross_clip_dual}")
    if delta_step < 0:
        raise ValueError(f"delta_step must be >= 0, got {delta_step}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if int(update_index) != update_index or update_index < 0:
        raise ValueError(f"update_index must be a non-negative integer, got {update_index}")
    if log_ratio_clip is not None and not log_ratio_clip > 0:
        raise ValueError(f"log_ratio_clip must be positive or None, got {log_ratio_clip}")
    for name, val in (("num_seqs", num_seqs), ("num_tokens", num_tokens)):
        if val is not None and not val > 0:
            raise ValueError(f"{name} must be positive or None, got {val}")

    hp = {
        "eps_low": float(eps_low),
        "eps_high": float(eps_high),
        "lo": float(cross_clip_lower_bound(delta, delta_step, int(update_index), stepwise)),
        "hi": float(cross_clip_high),
        "dual": float(cross_clip_dual),
        "alpha": float(alpha),
        "clip_val": float(log_ratio_clip) if log_ratio_clip is not None else 0.0,
        "clip_mode": 0 if log_ratio_clip is None else (1 if log_ratio_clip_mode == "symmetric" else 2),
        "cross_clip": bool(cross_clip),
        "cross_min": bool(cross_clip) and cross_clip_mode == "pessimistic",
        "token_level": token_level,
        "token_mean": loss_agg == "token-mean",
        "num_seqs": num_seqs,
        "num_tokens": num_tokens,
    }
    chosen = resolve_backend(backend, logp, _hacpo_fwd_kernel)
    if chosen == "triton":
        if logp.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"logp dtype {logp.dtype} is not supported by the triton backend")
        loss, obj, stats = _HacpoLossTriton.apply(
            _rowwise(logp), _rowwise(mask), _rowwise(old_logp) if token_level else None,
            advantages.contiguous(), old_logp_mean.contiguous() if not token_level else None,
            _as_loadable(is_own).contiguous(), coef.contiguous(), hp,
        )
    else:
        loss, obj, stats = _hacpo_loss_torch(logp, mask, old_logp, advantages, old_logp_mean, is_own, coef, hp)
    return loss, obj, _metrics_from_stats(stats)
