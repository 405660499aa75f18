r"""Per-token log-probabilities (and entropy) from logits, in one pass over the vocabulary.

For a row of logits ``x`` (length V), temperature ``T`` and label ``y``, with ``z = x / T``:

.. math::

    \mathrm{lse} = \log \sum_j e^{z_j}, \qquad \log p_y = z_y - \mathrm{lse}, \qquad
    H = -\sum_j p_j \log p_j = \log \ell - t / \ell

where the online softmax keeps, per row, the running maximum ``m``, ``\ell = \sum_j e^{z_j - m}`` and the
shift-invariant entropy accumulator ``t = \sum_j e^{z_j - m}(z_j - m)``. On a new maximum ``m'`` with
``a = e^{m - m'}``: ``\ell' = a\ell + \sum e^{z - m'}`` and ``t' = a(t + (m - m')\ell) + \sum e^{z-m'}(z - m')``.
Accumulating ``t`` instead of ``\sum e^{z-m} z`` avoids the cancellation of two large terms in ``H`` when the
logits are large.

Backward, for upstream gradients ``g = dL/d\log p_y`` and ``h = dL/dH`` (``p_j = e^{z_j - lse}``):

.. math::

    \frac{\partial L}{\partial x_j} = \frac{1}{T}\Big[g\,(1[j = y] - p_j) - h\,p_j(\log p_j + H)\Big]

Only ``lse`` (and ``H``) is saved per row: 4 (8) bytes per token.

Conventions: rows whose label equals ``ignore_index`` get ``logp = 0`` and no log-prob gradient; their
entropy is computed like every other row (and receives its gradient). Rows are packed tokens ``[N, V]``;
the row stride is free, the vocabulary dimension must be contiguous. Offsets are 64-bit.

Two implementations with one contract:

* Triton (``_logprobs_fwd_kernel`` / ``_logprobs_bwd_kernel``): one program per row, ``BLOCK_V`` vocabulary
  tiles, loads bf16/fp16/fp32 and computes in fp32, never materialises an fp32 copy of the logits; the
  backward can write ``d logits`` in place into the logits buffer.
* torch twin (``logprobs_fwd_torch`` / ``logprobs_bwd_torch``): the same math with torch ops on row chunks
  (at most 1024 rows and 2**26 elements per chunk), so the fp32 working set is bounded by the chunk.
"""
from __future__ import annotations

import torch

from ._utils import FLOAT_DTYPES, check_labels, next_power_of_2, tl, triton
from .dispatch import resolve_backend

__all__ = [
    "logprobs_from_logits",
    "logprobs_fwd_triton",
    "logprobs_bwd_triton",
    "logprobs_fwd_torch",
    "logprobs_bwd_torch",
]

_MAX_BLOCK_V = 4096
_TWIN_CHUNK_ROWS = 1024
_TWIN_CHUNK_ELEMS = 1 << 26
_LOG_ZERO = -1.0e4
"""Shifted logits / log-probs below this are clamped in the twin: e^-1e4 is 0 in fp32 and fp64 alike."""


# --------------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _logprobs_fwd_kernel(
    logits_ptr,
    labels_ptr,
    logp_ptr,
    entropy_ptr,
    lse_ptr,
    n_cols,
    stride_row,
    INV_TEMP: tl.constexpr,
    WITH_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per row: online softmax over ``BLOCK_V`` tiles -> lse, logp of the label, entropy."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    cols = tl.arange(0, BLOCK_V)

    m = float("-inf")
    acc_l = 0.0
    acc_t = 0.0
    for start in range(0, n_cols, BLOCK_V):
        idx = start + cols
        valid = idx < n_cols
        z = tl.load(row_ptr + idx, mask=valid, other=float("-inf")).to(tl.float32) * INV_TEMP
        m_new = tl.maximum(m, tl.max(z, axis=0))
        e = tl.exp(z - m_new)
        alpha = tl.exp(m - m_new)
        if WITH_ENTROPY:
            # e == 0 covers masked lanes and -inf logits, where (z - m_new) is -inf; acc_l == 0 means m == -inf.
            tile_t = tl.sum(e * tl.where(e > 0.0, z - m_new, 0.0), axis=0)
            shift = tl.where(acc_l > 0.0, m - m_new, 0.0)
            acc_t = alpha * (acc_t + shift * acc_l) + tile_t
        acc_l = alpha * acc_l + tl.sum(e, axis=0)
        m = m_new

    log_l = tl.log(acc_l)
    label = tl.load(labels_ptr + row).to(tl.int64)
    has_label = (label >= 0) & (label < n_cols)
    z_y = tl.load(row_ptr + label, mask=has_label, other=0.0).to(tl.float32) * INV_TEMP
    # (z_y - m) - log l rather than z_y - lse: no cancellation between two large numbers
    tl.store(logp_ptr + row, tl.where(has_label, (z_y - m) - log_l, 0.0))
    tl.store(lse_ptr + row, m + log_l)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + row, log_l - acc_t / acc_l)


@triton.jit
def _logprobs_bwd_kernel(
    logits_ptr,
    dlogits_ptr,
    labels_ptr,
    lse_ptr,
    entropy_ptr,
    dlogp_ptr,
    dentropy_ptr,
    n_cols,
    stride_row,
    stride_drow,
    INV_TEMP: tl.constexpr,
    HAS_DLOGP: tl.constexpr,
    HAS_DENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per row: dz_j = [g(1[j=y] - p_j) - h p_j (log p_j + H)] / T, stored in the logits dtype.

    ``dlogits_ptr`` may alias ``logits_ptr`` (in-place backward): every element is read before it is written,
    by the same program, in the same tile iteration.
    """
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    drow_ptr = dlogits_ptr + row * stride_drow
    cols = tl.arange(0, BLOCK_V)
    lse = tl.load(lse_ptr + row)
    label = tl.load(labels_ptr + row).to(tl.int64)
    if HAS_DLOGP:
        g = tl.load(dlogp_ptr + row).to(tl.float32)
    if HAS_DENTROPY:
        h = tl.load(dentropy_ptr + row).to(tl.float32)
        ent = tl.load(entropy_ptr + row)
    for start in range(0, n_cols, BLOCK_V):
        idx = start + cols
        valid = idx < n_cols
        z = tl.load(row_ptr + idx, mask=valid, other=float("-inf")).to(tl.float32) * INV_TEMP
        logp_j = z - lse
        p = tl.exp(logp_j)
        dz = tl.zeros([BLOCK_V], dtype=tl.float32)
        if HAS_DLOGP:
            dz = tl.where(idx == label, g, 0.0) - g * p
        if HAS_DENTROPY:
            dz -= h * p * (tl.where(p > 0.0, logp_j, 0.0) + ent)
        tl.store(drow_ptr + idx, (dz * INV_TEMP).to(dlogits_ptr.dtype.element_ty), mask=valid)


def _block_v(n_cols: int, block_v: int | None) -> int:
    if block_v is not None:
        if block_v <= 0 or block_v & (block_v - 1):
            raise ValueError(f"block_v must be a positive power of two, got {block_v}")
        return block_v
    return min(next_power_of_2(n_cols), _MAX_BLOCK_V)


def _num_warps(block_v: int) -> int:
    return 8 if block_v >= 2048 else 4


def _new_or_check(out: torch.Tensor | None, shape, dtype, device, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape {tuple(shape)} on {device}")
    return out


def logprobs_fwd_triton(
    logits: torch.Tensor,
    labels: torch.Tensor,
    inv_temp: float,
    with_entropy: bool,
    *,
    out_logp: torch.Tensor | None = None,
    out_entropy: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    block_v: int | None = None,
):
    """Launch the forward kernel. ``labels`` outside ``[0, V)`` mean "no label" (``logp = 0``).

    Returns ``(logp fp32[N], entropy fp32[N] | None, lse fp32[N])``.
    """
    n_rows, n_cols = logits.shape
    dev = logits.device
    logp = _new_or_check(out_logp, (n_rows,), torch.float32, dev, "out_logp")
    lse = _new_or_check(out_lse, (n_rows,), torch.float32, dev, "out_lse")
    entropy = _new_or_check(out_entropy, (n_rows,), torch.float32, dev, "out_entropy") if with_entropy else None
    if n_rows == 0:
        return logp, entropy, lse
    bv = _block_v(n_cols, block_v)
    _logprobs_fwd_kernel[(n_rows,)](
        logits,
        labels,
        logp,
        entropy if with_entropy else lse,  # unused pointer when WITH_ENTROPY is False
        lse,
        n_cols,
        logits.stride(0),
        INV_TEMP=float(inv_temp),
        WITH_ENTROPY=bool(with_entropy),
        BLOCK_V=bv,
        num_warps=_num_warps(bv),
    )
    return logp, entropy, lse


def logprobs_bwd_triton(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    dlogp: torch.Tensor | None,
    dentropy: torch.Tensor | None,
    inv_temp: float,
    *,
    out: torch.Tensor | None = None,
    block_v: int | None = None,
) -> torch.Tensor:
    """Launch the backward kernel; ``out`` may be ``logits`` itself (in place). Returns ``d logits``.

    ``dlogp`` must already be zero on rows without a label; ``labels`` outside ``[0, V)`` add no one-hot term.
    """
    n_rows, n_cols = logits.shape
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    elif out.shape != logits.shape or out.stride(-1) != 1:
        raise ValueError(f"out must have shape {tuple(logits.shape)} with a contiguous last dimension")
    if n_rows == 0:
        return out
    if dentropy is not None and entropy is None:
        raise ValueError("dentropy needs the forward entropy")
    bv = _block_v(n_cols, block_v)
    _logprobs_bwd_kernel[(n_rows,)](
        logits,
        out,
        labels,
        lse,
        entropy if entropy is not None else lse,
        dlogp if dlogp is not None else lse,
        dentropy if dentropy is not None else lse,
        n_cols,
        logits.stride(0),
        out.stride(0),
        INV_TEMP=float(inv_temp),
        HAS_DLOGP=dlogp is not None,
        HAS_DENTROPY=dentropy is not None,
        BLOCK_V=bv,
        num_warps=_num_warps(bv),
    )
    return out


# --------------------------------------------------------------------------------------------------------------
# torch twin
# --------------------------------------------------------------------------------------------------------------
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _twin_chunk_rows(n_cols: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows <= 0:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        return chunk_rows
    return max(1, min(_TWIN_CHUNK_ROWS, _TWIN_CHUNK_ELEMS // max(n_cols, 1)))


def logprobs_fwd_torch(
    logits: torch.Tensor,
    labels: torch.Tensor,
    inv_temp: float,
    with_entropy: bool,
    *,
    out_logp: torch.Tensor | None = None,
    out_entropy: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    chunk_rows: int | None = None,
):
    """torch twin of :func:`logprobs_fwd_triton` (fp32 math, fp64 for fp64 logits), chunked over rows."""
    n_rows, n_cols = logits.shape
    cdt = _compute_dtype(logits.dtype)
    dev = logits.device
    logp = _new_or_check(out_logp, (n_rows,), cdt, dev, "out_logp")
    lse = _new_or_check(out_lse, (n_rows,), cdt, dev, "out_lse")
    entropy = _new_or_check(out_entropy, (n_rows,), cdt, dev, "out_entropy") if with_entropy else None
    step = _twin_chunk_rows(n_cols, chunk_rows)
    for s in range(0, n_rows, step):
        e = min(s + step, n_rows)
        z = logits[s:e].to(cdt, copy=True)  # the chunk's working buffer
        if inv_temp != 1.0:
            z.mul_(inv_temp)
        m = z.amax(dim=-1)
        z.sub_(m.unsqueeze(1))  # z - m <= 0: no cancellation in log p or H for large logits
        lab = labels[s:e].long()
        has = (lab >= 0) & (lab < n_cols)
        z_y = z.gather(1, lab.clamp(0, n_cols - 1).unsqueeze(1)).squeeze(1)
        z.clamp_(min=_LOG_ZERO)  # exp() is 0 either way; keeps 0 * (z - m) finite for -inf logits
        p = z.exp()  # e^(z - m)
        acc_l = p.sum(dim=-1)
        log_l = acc_l.log()
        logp[s:e] = torch.where(has, z_y - log_l, torch.zeros_like(z_y))
        lse[s:e] = m + log_l
        if with_entropy:
            acc_t = p.mul_(z).sum(dim=-1)  # t = sum e^(z - m) (z - m)
            entropy[s:e] = log_l - acc_t / acc_l
        del z, p  # free this chunk's buffers before the next chunk allocates its own
    return logp, entropy, lse


def logprobs_bwd_torch(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor | None,
    dlogp: torch.Tensor | None,
    dentropy: torch.Tensor | None,
    inv_temp: float,
    *,
    out: torch.Tensor | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """torch twin of :func:`logprobs_bwd_triton`, chunked over rows; ``out`` may be ``logits`` (in place)."""
    n_rows, n_cols = logits.shape
    cdt = _compute_dtype(logits.dtype)
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    if dentropy is not None and entropy is None:
        raise ValueError("dentropy needs the forward entropy")
    step = _twin_chunk_rows(n_cols, chunk_rows)
    for s in range(0, n_rows, step):
        e = min(s + step, n_rows)
        z = logits[s:e].to(cdt, copy=True)
        if inv_temp != 1.0:
            z.mul_(inv_temp)
        z.sub_(lse[s:e].to(cdt).unsqueeze(1)).clamp_(min=_LOG_ZERO)  # log p_j (p_j is 0 below _LOG_ZERO anyway)
        p = z.exp()
        # dz = p * (-g - h (log p + H)) + g 1[j = y]
        if dentropy is not None:
            z.add_(entropy[s:e].to(cdt).unsqueeze(1)).mul_(-dentropy[s:e].to(cdt).unsqueeze(1))
        else:
            z.zero_()
        if dlogp is not None:
            z.sub_(dlogp[s:e].to(cdt).unsqueeze(1))
        z.mul_(p)
        if dlogp is not None:
            lab = labels[s:e].long()
            has = (lab >= 0) & (lab < n_cols)
            g = torch.where(has, dlogp[s:e].to(cdt), torch.zeros((), dtype=cdt, device=z.device))
            z.scatter_add_(1, lab.clamp(0, n_cols - 1).unsqueeze(1), g.unsqueeze(1))  # + g 1[j = y], no sync
        out[s:e].copy_(z.mul_(inv_temp))
        del z, p
    return out


# --------------------------------------------------------------------------------------------------------------
# autograd + public function
# --------------------------------------------------------------------------------------------------------------
class _LogprobsFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, local_labels, inv_temp, with_entropy, inplace_backward, backend):
        if backend == "triton":
            logp, entropy, lse = logprobs_fwd_triton(logits, local_labels, inv_temp, with_entropy)
        else:
            logp, entropy, lse = logprobs_fwd_torch(logits, local_labels, inv_temp, with_entropy)
        ctx.save_for_backward(logits, local_labels, lse, entropy if with_entropy else lse)
        ctx.inv_temp = inv_temp
        ctx.with_entropy = with_entropy
        ctx.inplace_backward = inplace_backward
        ctx.backend = backend
        ctx.set_materialize_grads(False)
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    def backward(ctx, dlogp, dentropy=None):
        logits, local_labels, lse, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            entropy = None
            dentropy = None
        if dlogp is None and dentropy is None:
            return None, None, None, None, None, None
        if dlogp is not None:
            # rows without a label get no log-prob gradient
            dlogp = torch.where(local_labels >= 0, dlogp, torch.zeros_like(dlogp)).contiguous()
        if dentropy is not None:
            dentropy = dentropy.contiguous()
        out = logits if ctx.inplace_backward else None
        if ctx.backend == "triton":
            dlogits = logprobs_bwd_triton(logits, local_labels, lse, entropy, dlogp, dentropy, ctx.inv_temp, out=out)
        else:
            dlogits = logprobs_bwd_torch(logits, local_labels, lse, entropy, dlogp, dentropy, ctx.inv_temp, out=out)
        return dlogits, None, None, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
    inplace_backward: bool = False,
    backend: str = "auto",
):
    """Per-token ``log softmax(logits / T)[label]`` and optionally the entropy of ``softmax(logits / T)``.

    Args:
        logits: ``[N, V]`` bf16/fp16/fp32 (fp64 on the torch backend); any row stride, contiguous last dim
            (otherwise one contiguous copy is made).
        labels: ``[N]`` integer token ids in ``[0, V)`` or ``ignore_index``.
        temperature: positive; logits are divided by it.
        return_entropy: also return the per-row entropy.
        ignore_index: label value of rows without a target: ``logp = 0`` there and no log-prob gradient;
            their entropy is still computed.
        inplace_backward: write ``d logits`` into the logits buffer during backward (saves one ``[N, V]``
            buffer). Only safe when nothing else needs the logits after this op's backward.
        backend: ``"auto"`` | ``"triton"`` | ``"torch"`` (see :func:`kernels.dispatch.resolve_backend`).

    Returns:
        ``(logp[N], entropy[N] | None)`` in fp32 (fp64 for fp64 logits on the torch backend).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [N, V], got shape {tuple(logits.shape)}")
    n_rows, n_cols = logits.shape
    if n_cols == 0:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    if not (temperature > 0):
        raise ValueError(f"temperature must be positive, got {temperature}")
    check_labels(labels, n_rows, n_cols, ignore_index)
    if labels.device != logits.device:
        raise ValueError(f"labels are on {labels.device} but logits on {logits.device}")
    chosen = resolve_backend(backend, logits, _logprobs_fwd_kernel)
    allowed = FLOAT_DTYPES if chosen == "triton" else FLOAT_DTYPES + (torch.float64,)
    if logits.dtype not in allowed:
        raise ValueError(f"logits dtype {logits.dtype} is not supported by the {chosen} backend (use one of {allowed})")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    local_labels = torch.where(labels == ignore_index, torch.full_like(labels, -1), labels).long().contiguous()
    out = _LogprobsFromLogits.apply(
        logits, local_labels, 1.0 / float(temperature), bool(return_entropy), bool(inplace_backward), chosen
    )
    if return_entropy:
        return out[0], out[1]
    return out, None
