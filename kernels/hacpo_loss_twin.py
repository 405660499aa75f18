"""The torch twin of the HACPO loss (plain differentiable torch ops): the same math as the Triton kernels, for CPU
tensors and float64; :mod:`hacpo_kernels.hacpo_loss` dispatches to it and holds the formulas."""
from __future__ import annotations

import torch

from .hacpo_loss_params import KL_LOG_RATIO_LIMIT, KL_VALUE_LIMIT, STATS, LossParams, LossTotals, _denominators


def _rollout_is_apply(w: torch.Tensor, p: LossParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(applied weight rho, truncated, masked) of raw correction weights ``w``: truncate ``rho = min(w, C)``; mask
    ``rho = w`` inside ``[C_low, C]``, else 0."""
    if p.is_mode == 1:
        return w.clamp(max=p.is_hi), w > p.is_hi, torch.zeros_like(w, dtype=torch.bool)
    keep = (w >= p.is_lo) & (w <= p.is_hi)
    return torch.where(keep, w, torch.zeros_like(w)), torch.zeros_like(keep), ~keep


def _rollout_is_weights(p: LossParams, valid, own, nonempty, safe_count, old_logp, old_mean, engine_logp,
                        engine_mean, cdt) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The detached correction weight of every unit of the loss (``[B, T]`` at token level, ``[B]`` at sequence
    level) and its counters (:data:`~.hacpo_loss_params.STATS` ``is_*``).

    Per row (every foreign row; own rows at level ``sequence``): ``w_i = exp(old_mean_i - engine_mean_i)``, both the
    source's means over its own tokens. Per own token (level ``token``): ``w_it = exp(old_it - engine_it)``; a
    sequence-ratio row then takes the mean of its tokens' applied weights (its row objective is the mean of its
    tokens' weighted objectives, each token's objective being the row's)."""
    zero = torch.zeros((), dtype=cdt, device=valid.device)
    w_seq = (old_mean.detach().to(cdt) - engine_mean.detach().to(cdt)).exp()
    rho_seq, trunc_seq, mask_seq = _rollout_is_apply(w_seq, p)
    for_units = nonempty & ~own
    if p.is_token:
        own_units = valid & own[:, None]
        w_tok = torch.where(own_units, old_logp.detach().to(cdt) - engine_logp.detach().to(cdt), zero).exp()
        rho_tok, trunc_own, mask_own = _rollout_is_apply(w_tok, p)
        rho_own = rho_tok
        if p.token_level:
            rho = torch.where(own[:, None], rho_tok, rho_seq[:, None])
        else:
            rho = torch.where(own, torch.where(own_units, rho_tok, zero).sum(dim=-1) / safe_count, rho_seq)
    else:
        own_units, trunc_own, mask_own, rho_own = nonempty & own, trunc_seq, mask_seq, rho_seq
        rho = rho_seq[:, None] if p.token_level else rho_seq

    def total(x: torch.Tensor) -> torch.Tensor:
        return x.sum().to(cdt)

    values = {
        "is_own_units": total(own_units),
        "is_own_truncated": total(own_units & trunc_own),
        "is_own_masked": total(own_units & mask_own),
        "is_own_weight": torch.where(own_units, rho_own, zero).sum(),
        "is_foreign_units": total(for_units),
        "is_foreign_truncated": total(for_units & trunc_seq),
        "is_foreign_masked": total(for_units & mask_seq),
        "is_foreign_weight": torch.where(for_units, rho_seq, zero).sum(),
    }
    return rho, values


def _hacpo_loss_torch(logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, params: LossParams,
                      totals: LossTotals, engine_logp=None, engine_mean=None):
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
    is_values = {}
    if p.rollout_is:  # training-inference correction: the unit objective times its detached weight rho
        rho, is_values = _rollout_is_weights(p, valid, own, nonempty, safe_count, old_logp, old_mean, engine_logp,
                                             engine_mean, cdt)
        unit_obj = unit_obj * rho
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
    values.update({name: is_values.get(name, zero) for name in STATS if name.startswith("is_")})
    stats = torch.stack([values[name] for name in STATS])
    denom, kl_denom = _denominators(stats, p, totals)
    pg_loss = -loss_sum / denom
    kl = kl_sum / kl_denom
    loss = pg_loss + p.kl_coef * kl
    return loss, obj.detach(), ratio, stats, pg_loss.detach(), kl.detach()

