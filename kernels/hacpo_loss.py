r"""HACPO / GSPO / GRPO / Naive policy loss on ``[B, T]`` token log-probs: one Triton launch forward, one backward.

The loss math lives here and in three modules split by job: the Triton kernels for CUDA tensors
(:mod:`.hacpo_loss_triton`), a plain-torch twin for everything else (:mod:`.hacpo_loss_twin`) and the parameters,
their rules and the counters both fill (:mod:`.hacpo_loss_params`). This module holds the formulas, the launch and
the one dispatcher, :func:`hacpo_loss`, chosen by :func:`hacpo_kernels.dispatch.resolve_backend`. The registered
policy losses of ``openrlhf_hacpo.algorithms.losses`` call it.

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

Training-inference correction (``rollout_is``, off by default; verl's ``rollout_is`` family). The engine that
sampled row ``i`` (``\pi_{eng}``, vLLM or an HF engine) and the trainer's old policy (``\pi_{old}``, the scoring
pass) can differ; a detached weight ``\rho`` multiplies each unit objective, ``o_{i,t} \to \rho\, o_{i,t}``:

* raw weight per row (level ``sequence``; every foreign row whatever the level): the mean over the source's own
  ``L_j`` tokens, ``w_i = \exp(\overline{\log\pi_{old}}_i - \overline{\log\pi_{eng}}_i)`` from ``old_logp_mean``
  and ``engine_logp_mean`` (a mean, not a sum: a sum would grow the weight's spread with the length and, once
  truncated, cut long rows most). Per own token (level ``token``):
  ``w_{i,t} = \exp(\log\pi_{old}(y_{i,t}) - \log\pi_{eng}(y_{i,t}))`` from ``old_logp`` and ``engine_logp``.
  Foreign rows have no per-token weight: the learner's tokens are not the source's;
* ``truncate``: ``\rho = \min(w, C)``; ``mask``: ``\rho = w\,1[C_{low} \le w \le C]`` (``C_{low}`` given, else
  ``1/C``), ``C`` = ``rollout_is_threshold``;
* sequence ratios: ``obj_i \to \bar\rho_i\,obj_i`` with ``\bar\rho_i = \rho_i`` (row weight) or
  ``\frac{1}{L_i}\sum_t mask_{i,t}\rho_{i,t}`` (an own row at level ``token``: the mean of its tokens' weighted
  objectives, each token's objective being the row's); gradient ``\bar\rho_i`` times the uncorrected one;
* token ratios: ``o_{i,t} \to \rho_{i,t}\,o_{i,t}`` (own tokens at level ``token``, else ``\rho_i``), gradient per
  token likewise;
* normaliser rule: a masked unit contributes 0 and **keeps its place in every denominator** (``D`` = rows or tokens,
  and ``L_i`` of its row), so the loss is the plain importance-sampling estimate with the masked units' weights set
  to 0. The denominators are then known before the update (the mini-batch totals of :class:`LossTotals`), micro-batch
  losses still add up, and a masked foreign row has exactly zero gradient (the zero-gradient probe skips it);
* the KL term is not corrected.

With the correction off none of this runs (compile-time switches in the kernels, a skipped branch in the twin) and
the loss is computed as before, to the bit.

Metrics (0-d tensors, no device sync; :data:`METRIC_NAMES`, each averaged with the weight in :data:`METRIC_WEIGHTS`):
``own_clip_frac_lower`` / ``own_clip_frac_upper`` (own units with ``s < 1-\epsilon_{low}`` / ``s > 1+\epsilon_{high}``),
``foreign_clip_frac_lower`` / ``foreign_clip_frac_upper`` / ``foreign_in_window_frac`` (foreign units with
``s < lo`` / ``s > hi`` / inside ``[lo, hi]``), ``own_ratio_mean`` / ``foreign_ratio_mean`` (mean ``s``), and the row
counts ``num_own`` / ``num_foreign``; ``foreign_pos_*`` the same window fractions among foreign units with
``A > 0`` and ``foreign_neg_*`` among those with ``A < 0``; ``pg_loss`` and ``kl`` (the two terms of the loss). A
unit is a non-empty sequence (sequence level) or a valid token (token level). With ``rollout_is`` also
:data:`ROLLOUT_IS_METRIC_NAMES`: ``rollout_is_{own,foreign}_{truncated,masked}_frac`` (share of the correction's
units truncated / masked) and ``rollout_is_{own,foreign}_weight_mean`` (mean applied weight ``\rho``), own units
being own tokens (level ``token``) or own rows.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._utils import FLOAT_DTYPES, cdiv, is_interpreted, next_power_of_2
from .dispatch import resolve_backend
from .hacpo_loss_params import (CROSS_CLIP_MODES, FOREIGN_RULES, KL_LOG_RATIO_LIMIT, KL_VALUE_LIMIT,
                                LOG_RATIO_CLIP_MODES, LOSS_AGGS, METRIC_NAMES, METRIC_WEIGHTS, NUM_STATS, RATIO_LEVELS,
                                ROLLOUT_IS_LEVELS, ROLLOUT_IS_METRIC_NAMES, ROLLOUT_IS_MODES, STATS, _RATIO_METRICS,
                                _ROLLOUT_IS_METRICS, _STAT_INDEX, LossParams, LossTotals, _denominators,
                                check_loss_params, cross_clip_lower_bound, stat)
from .hacpo_loss_triton import _hacpo_bwd_kernel, _hacpo_fwd_kernel
from .hacpo_loss_twin import _hacpo_loss_torch

__all__ = [
    "hacpo_loss",
    "HacpoLossOutput",
    "LossParams",
    "LossTotals",
    "check_loss_params",
    "cross_clip_lower_bound",
    "STATS",
    "METRIC_NAMES",
    "ROLLOUT_IS_METRIC_NAMES",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_IS_MODES",
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


class HacpoLossOutput(NamedTuple):
    """``loss`` 0-d (to minimise); ``objectives`` [B] detached per-row objectives; ``ratios`` [B] detached sequence
    ratios s after the log-ratio clamp (``None`` at token level); ``metrics`` 0-d tensors named in
    :data:`METRIC_NAMES`; ``stats`` [NUM_STATS] the summed counters of :data:`STATS` (metric weights)."""

    loss: torch.Tensor
    objectives: torch.Tensor
    ratios: torch.Tensor | None
    metrics: dict[str, torch.Tensor]
    stats: torch.Tensor | None = None


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


def _launch_args(params: LossParams) -> tuple[tuple, dict]:
    """The scalar arguments and compile-time switches shared by the forward and backward launches."""
    scalars = (params.eps_low, params.eps_high, params.lo, params.hi, params.cross_clip_dual, params.own_dual,
               params.alpha, params.clip_val, KL_LOG_RATIO_LIMIT, KL_VALUE_LIMIT, params.is_lo, params.is_hi)
    switches = dict(TOKEN_LEVEL=params.token_level, CLIP_MODE=params.clip_mode, CROSS_CLIP=params.cross_clip,
                    CROSS_MIN=params.cross_min, OWN_DUAL=params.dual_clip_c is not None,
                    FOREIGN_SELF=params.self_clip, IS_MODE=params.is_mode, IS_TOKEN=params.is_token)
    return tuple(float(x) for x in scalars), switches


class _HacpoLossTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, mask, old_logp, ref_logp, adv, old_mean, own, coef, engine_logp, engine_mean, params,
                totals):
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
        eng_arg = engine_logp if engine_logp is not None else logp
        eng_mean_arg = engine_mean if engine_mean is not None else adv
        scalars, switches = _launch_args(params)
        if n_rows == 0:
            partials.zero_()
        else:
            _hacpo_fwd_kernel[(n_prog,)](
                logp, mask, old_arg, ref_arg, adv, old_mean_arg, own, coef, eng_arg, eng_mean_arg, obj, ratio, rowg,
                rowkl, partials, n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0),
                ref_arg.stride(0), eng_arg.stride(0), *scalars,
                HAS_KL=ref_logp is not None, TOKEN_MEAN=params.token_mean, NUM_STATS=NUM_STATS, BLOCK_B=block_b,
                BLOCK_T=block_t, num_warps=warps, **switches,
            )
        stats = partials.sum(dim=0) if n_prog > 1 else partials[0]
        denom, kl_denom = _denominators(stats, params, totals)
        pg_loss = -stat(stats, "loss") / denom
        kl = stat(stats, "kl") / kl_denom
        loss = pg_loss + params.kl_coef * kl
        ctx.save_for_backward(logp, mask, old_arg, ref_arg, adv, own, coef, eng_arg, rowg, rowkl, denom, kl_denom)
        ctx.params, ctx.has_kl = params, ref_logp is not None
        ctx.mark_non_differentiable(obj, ratio, stats, pg_loss, kl)
        return loss, obj, ratio, stats, pg_loss, kl

    @staticmethod
    def backward(ctx, dloss, *_unused):
        logp, mask, old_arg, ref_arg, adv, own, coef, eng_arg, rowg, rowkl, denom, kl_denom = ctx.saved_tensors
        params = ctx.params
        n_rows, n_cols = logp.shape
        grad = torch.empty((n_rows, n_cols), dtype=logp.dtype, device=logp.device)
        if dloss is None:
            return (grad.zero_(),) + (None,) * 11
        scales = torch.stack([-dloss / denom, dloss * params.kl_coef / kl_denom]).to(torch.float32)
        block_b, block_t, warps = _tile(True, n_rows, n_cols)
        scalars, switches = _launch_args(params)
        if n_rows and n_cols:
            _hacpo_bwd_kernel[(cdiv(n_rows, block_b), cdiv(n_cols, block_t))](
                logp, mask, old_arg, ref_arg, adv, own, coef, eng_arg, rowg, rowkl, scales, grad,
                n_rows, n_cols, logp.stride(0), mask.stride(0), old_arg.stride(0), ref_arg.stride(0),
                eng_arg.stride(0), grad.stride(0), *scalars, HAS_KL=ctx.has_kl, BLOCK_B=block_b, BLOCK_T=block_t,
                num_warps=warps,
                **switches,
            )
        return (grad,) + (None,) * 11


# --------------------------------------------------------------------------------------------------------------
# public function
# --------------------------------------------------------------------------------------------------------------
_metric_weights_cache: dict = {}


def _metric_weights(device, dtype, table: dict = _RATIO_METRICS) -> tuple[torch.Tensor, torch.Tensor]:
    """([2, K, S] numerator/denominator weights, [K] denominator offset) of the metrics of ``table`` on ``device``,
    built once per device."""
    key = (str(device), dtype, tuple(table))
    if key not in _metric_weights_cache:
        weights = torch.zeros(2, len(table), NUM_STATS, dtype=dtype)
        offset = torch.zeros(len(table), dtype=dtype)
        for k, (numerator, denominator) in enumerate(table.values()):
            for stat, w in numerator.items():
                weights[0, k, _STAT_INDEX[stat]] = w
            if denominator is None:
                offset[k] = 1.0
            else:
                weights[1, k, _STAT_INDEX[denominator]] = 1.0
        _metric_weights_cache[key] = (weights.to(device), offset.to(device))
    return _metric_weights_cache[key]


def _metrics_from_stats(stats: torch.Tensor, pg_loss: torch.Tensor, kl: torch.Tensor,
                        rollout_is: bool = False) -> dict[str, torch.Tensor]:
    """All ratio metrics in a few elementwise launches (no matmul: TF32 would round the counters); the correction's
    (:data:`ROLLOUT_IS_METRIC_NAMES`) only with ``rollout_is``."""
    metrics = {"pg_loss": pg_loss, "kl": kl}
    for table in (_RATIO_METRICS, _ROLLOUT_IS_METRICS) if rollout_is else (_RATIO_METRICS,):
        weights, offset = _metric_weights(stats.device, stats.dtype, table)
        num_den = (weights * stats).sum(dim=-1)
        values = num_den[0] / (num_den[1] + offset).clamp(min=1.0)
        metrics.update({name: values[k] for k, name in enumerate(table)})
    return metrics


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
    engine_logp: torch.Tensor | None = None,
    engine_logp_mean: torch.Tensor | None = None,
    totals: LossTotals | None = None,
    backend: str = "auto",
) -> HacpoLossOutput:
    """HACPO / GSPO / GRPO / Naive loss for one learner on a micro-batch of ``B`` rows (formulas in the module
    docstring).

    Args:
        logp: ``[B, T]`` current token log-probs of the learner (differentiable).
        mask: ``[B, T]`` bool/int/float, nonzero where a token counts.
        advantages: ``[B]`` capability-aware advantages ``A_i`` (eq. 6).
        old_logp_mean: ``[B]`` masked mean of the source policy's old log-probs over the source's own tokens
            (sequence level and with ``params.rollout_is``; may be ``None`` at token level otherwise).
        is_own: ``[B]`` bool, True where the row was generated by the learner itself.
        coef: ``[B]`` capability coefficient ``omega^(j,k)`` (1 for own rows, eq. 10).
        params: :class:`LossParams` (validated when built; default ``LossParams()``).
        old_logp: ``[B, T]`` old token log-probs on the same tokens (token level, or own rows with
            ``params.rollout_is_level == "token"``).
        ref_logp: ``[B, T]`` reference log-probs of the low-variance (k3) KL on own tokens (weight
            ``params.kl_coef``), ``min(exp(d) - d - 1, 10)`` with ``d = clamp(ref - logp, ±20)``, aggregated like
            the policy term over own rows or own tokens; the metric ``kl`` is reported whenever it is given.
        engine_logp: ``[B, T]`` the sampling engine's log-probs of own rows' tokens (``params.rollout_is`` at level
            ``token``; other rows' values are not read).
        engine_logp_mean: ``[B]`` the source engine's mean log-prob over the source's own tokens
            (``params.rollout_is``).
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
    if not token_level or params.rollout_is:
        _check_tensor(old_logp_mean, "old_logp_mean", (n_rows,), dev)
    if params.rollout_is:
        if engine_logp_mean is None:
            raise ValueError("rollout_is needs engine_logp_mean [B], the sampling engine's mean log-prob per row")
        _check_tensor(engine_logp_mean, "engine_logp_mean", (n_rows,), dev)
    if params.is_token:
        for name, value in (("engine_logp", engine_logp), ("old_logp", old_logp)):
            if value is None:
                raise ValueError(f"rollout_is_level='token' needs {name} [B, T] on own rows' tokens")
            _check_tensor(value, name, (n_rows, n_cols), dev)
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
            _rowwise(logp), _rowwise(mask), _rowwise(old_logp) if token_level or params.is_token else None,
            _rowwise(ref_logp), advantages.contiguous(),
            old_logp_mean.contiguous() if not token_level or params.rollout_is else None,
            _as_loadable(is_own).contiguous(), coef.contiguous(), _rowwise(engine_logp) if params.is_token else None,
            engine_logp_mean.contiguous() if params.rollout_is else None, params, totals,
        )
        if token_level:
            ratio = None
    else:
        loss, obj, ratio, stats, pg_loss, kl = _hacpo_loss_torch(
            logp, mask, old_logp, ref_logp, advantages, old_logp_mean, is_own, coef, params, totals,
            engine_logp=engine_logp if params.is_token else None,
            engine_mean=engine_logp_mean if params.rollout_is else None)
    return HacpoLossOutput(loss, obj, ratio, _metrics_from_stats(stats, pg_loss, kl, params.rollout_is), stats)
