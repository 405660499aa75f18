"""The Triton kernels of the HACPO loss (forward and backward); :mod:`hacpo_kernels.hacpo_loss` launches them and
holds the formulas."""
from __future__ import annotations

from ._utils import tl, triton
from .hacpo_loss_params import (S_FNEG_ABOVE, S_FNEG_BELOW, S_FNEG_UNITS, S_FOREIGN_ABOVE, S_FOREIGN_BELOW,
                                S_FOREIGN_RATIO, S_FOREIGN_ROWS, S_FOREIGN_UNITS, S_FPOS_ABOVE, S_FPOS_BELOW,
                                S_FPOS_UNITS, S_KL, S_LOSS, S_OWN_ABOVE, S_OWN_BELOW, S_OWN_RATIO, S_OWN_ROWS,
                                S_OWN_TOKENS, S_OWN_UNITS, S_ROWS, S_TOKENS, S_IS_OWN_UNITS, S_IS_OWN_TRUNCATED,
                                S_IS_OWN_MASKED, S_IS_OWN_WEIGHT, S_IS_FOREIGN_UNITS, S_IS_FOREIGN_TRUNCATED,
                                S_IS_FOREIGN_MASKED, S_IS_FOREIGN_WEIGHT)


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
def _rollout_is_weight(w, is_lo, is_hi, IS_MODE: tl.constexpr):
    """Training-inference correction of raw weights ``w``: (applied weight rho, 1.0 where truncated, 1.0 where
    masked). Truncate (``IS_MODE`` 1): ``rho = min(w, C)``; mask (2): ``rho = w`` inside ``[C_low, C]``, else 0."""
    if IS_MODE == 1:
        rho = tl.minimum(w, is_hi)
        truncated = (w > is_hi).to(tl.float32)
        masked = truncated * 0.0
    else:
        keep = (w >= is_lo) & (w <= is_hi)
        rho = tl.where(keep, w, 0.0)
        masked = 1.0 - keep.to(tl.float32)
        truncated = masked * 0.0
    return rho, truncated, masked


@triton.jit
def _hacpo_fwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, old_mean_ptr, own_ptr, coef_ptr, eng_ptr, eng_mean_ptr,
    obj_ptr, ratio_ptr, rowg_ptr, rowkl_ptr, partial_ptr,
    n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref, stride_eng,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, own_dual_arg, alpha_arg, clip_arg, kl_limit_arg, kl_max_arg,
    is_lo_arg, is_hi_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    OWN_DUAL: tl.constexpr, FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, TOKEN_MEAN: tl.constexpr,
    IS_MODE: tl.constexpr, IS_TOKEN: tl.constexpr, NUM_STATS: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """BLOCK_B rows per program: masked sums over T tiles, per-row objective and gradient factors, partial sums.

    With the training-inference correction (``IS_MODE`` 1 truncate, 2 mask) each unit objective is multiplied by its
    weight rho: per row ``w = exp(old_mean - eng_mean)``; per own token (``IS_TOKEN``) ``w = exp(old - eng)``, a
    sequence-ratio row taking the mean of its tokens' rho. The row gradient factor carries rho too (at token level
    the backward recomputes the per-token rho of own rows)."""
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
    if IS_MODE != 0:
        is_lo = tl.cast(is_lo_arg, tl.float32)
        is_hi = tl.cast(is_hi_arg, tl.float32)
        is_old_mean = tl.load(old_mean_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        eng_mean = tl.load(eng_mean_ptr + rows64, mask=row_ok, other=0.0).to(tl.float32)
        rho_seq, trunc_seq, masked_seq = _rollout_is_weight(tl.exp(is_old_mean - eng_mean), is_lo, is_hi, IS_MODE)
    is_rho_sum = tl.zeros([BLOCK_B], dtype=tl.float32)  # own tokens' rho (IS_TOKEN)
    is_trunc_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    is_masked_sum = tl.zeros([BLOCK_B], dtype=tl.float32)

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
            if IS_MODE != 0:
                if IS_TOKEN:
                    own_w = valid & own[:, None]
                    eng = tl.load(eng_ptr + rows64[:, None] * stride_eng + t[None, :], mask=own_w, other=0.0)
                    rho_t, trunc_t, masked_t = _rollout_is_weight(tl.exp(tl.where(own_w, old - eng.to(tl.float32),
                                                                                   0.0)), is_lo, is_hi, IS_MODE)
                    is_rho_sum += tl.sum(tl.where(own_w, rho_t, 0.0), axis=1)
                    is_trunc_sum += tl.sum(tl.where(own_w, trunc_t, 0.0), axis=1)
                    is_masked_sum += tl.sum(tl.where(own_w, masked_t, 0.0), axis=1)
                    obj_t = obj_t * tl.where(own[:, None], rho_t, rho_seq[:, None])
                else:
                    obj_t = obj_t * rho_seq[:, None]
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
            if IS_TOKEN:
                own_w = valid & own[:, None]
                old = tl.load(old_ptr + rows64[:, None] * stride_old + t[None, :], mask=own_w, other=0.0)
                eng = tl.load(eng_ptr + rows64[:, None] * stride_eng + t[None, :], mask=own_w, other=0.0)
                rho_t, trunc_t, masked_t = _rollout_is_weight(
                    tl.exp(tl.where(own_w, old.to(tl.float32) - eng.to(tl.float32), 0.0)), is_lo, is_hi, IS_MODE)
                is_rho_sum += tl.sum(tl.where(own_w, rho_t, 0.0), axis=1)
                is_trunc_sum += tl.sum(tl.where(own_w, trunc_t, 0.0), axis=1)
                is_masked_sum += tl.sum(tl.where(own_w, masked_t, 0.0), axis=1)

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
        if IS_MODE != 0:  # rows corrected per row carry rho in their factor; own rows per token get it in backward
            if IS_TOKEN:
                rowg = rowg * tl.where(own, 1.0, rho_seq)
            else:
                rowg = rowg * rho_seq
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
        if IS_MODE != 0:
            if IS_TOKEN:
                rho_row = tl.where(own, is_rho_sum / safe_count, rho_seq)
            else:
                rho_row = rho_seq
            obj = obj * rho_row
            dobj = dobj * rho_row
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
    if IS_MODE != 0:
        is_for = nonempty & (own == 0)
        if IS_TOKEN:
            is_own_units = tl.where(own, count, 0.0)
            is_own_trunc = is_trunc_sum
            is_own_masked = is_masked_sum
            is_own_weight = is_rho_sum
        else:
            is_own = nonempty & own
            is_own_units = is_own.to(tl.float32)
            is_own_trunc = tl.where(is_own, trunc_seq, 0.0)
            is_own_masked = tl.where(is_own, masked_seq, 0.0)
            is_own_weight = tl.where(is_own, rho_seq, 0.0)
        tl.store(base + S_IS_OWN_UNITS, tl.sum(tl.where(row_ok, is_own_units, 0.0), axis=0))
        tl.store(base + S_IS_OWN_TRUNCATED, tl.sum(tl.where(row_ok, is_own_trunc, 0.0), axis=0))
        tl.store(base + S_IS_OWN_MASKED, tl.sum(tl.where(row_ok, is_own_masked, 0.0), axis=0))
        tl.store(base + S_IS_OWN_WEIGHT, tl.sum(tl.where(row_ok, is_own_weight, 0.0), axis=0))
        tl.store(base + S_IS_FOREIGN_UNITS, tl.sum(is_for.to(tl.float32), axis=0))
        tl.store(base + S_IS_FOREIGN_TRUNCATED, tl.sum(tl.where(is_for, trunc_seq, 0.0), axis=0))
        tl.store(base + S_IS_FOREIGN_MASKED, tl.sum(tl.where(is_for, masked_seq, 0.0), axis=0))
        tl.store(base + S_IS_FOREIGN_WEIGHT, tl.sum(tl.where(is_for, rho_seq, 0.0), axis=0))
    else:
        tl.store(base + S_IS_OWN_UNITS, 0.0)
        tl.store(base + S_IS_OWN_TRUNCATED, 0.0)
        tl.store(base + S_IS_OWN_MASKED, 0.0)
        tl.store(base + S_IS_OWN_WEIGHT, 0.0)
        tl.store(base + S_IS_FOREIGN_UNITS, 0.0)
        tl.store(base + S_IS_FOREIGN_TRUNCATED, 0.0)
        tl.store(base + S_IS_FOREIGN_MASKED, 0.0)
        tl.store(base + S_IS_FOREIGN_WEIGHT, 0.0)


@triton.jit
def _hacpo_bwd_kernel(
    logp_ptr, mask_ptr, old_ptr, ref_ptr, adv_ptr, own_ptr, coef_ptr, eng_ptr, rowg_ptr, rowkl_ptr, scale_ptr,
    grad_ptr, n_rows, n_cols, stride_lp, stride_mk, stride_old, stride_ref, stride_eng, stride_g,
    eps_low_arg, eps_high_arg, lo_arg, hi_arg, dual_arg, own_dual_arg, alpha_arg, clip_arg, kl_limit_arg, kl_max_arg,
    is_lo_arg, is_hi_arg,
    TOKEN_LEVEL: tl.constexpr, CLIP_MODE: tl.constexpr, CROSS_CLIP: tl.constexpr, CROSS_MIN: tl.constexpr,
    OWN_DUAL: tl.constexpr, FOREIGN_SELF: tl.constexpr, HAS_KL: tl.constexpr, IS_MODE: tl.constexpr,
    IS_TOKEN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """d loss / d logp[i, t] = pg_scale * mask * (row factor [* d o_t / d ell_t [* rho_t of an own token with
    IS_TOKEN] at token level]) + kl_scale * own mask * row KL weight * d k3 / d logp, with pg_scale = -dloss / D,
    kl_scale = dloss·β / D_kl."""
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
        if IS_MODE != 0:
            if IS_TOKEN:  # own tokens' correction weight (other rows carry theirs in rowg)
                own_w = valid & own[:, None]
                eng = tl.load(eng_ptr + rows64[:, None] * stride_eng + t[None, :], mask=own_w, other=0.0)
                rho_t, _trunc, _masked = _rollout_is_weight(
                    tl.exp(tl.where(own_w, old - eng.to(tl.float32), 0.0)), tl.cast(is_lo_arg, tl.float32),
                    tl.cast(is_hi_arg, tl.float32), IS_MODE)
                g = g * tl.where(own[:, None], rho_t, 1.0)
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

