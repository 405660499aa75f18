r"""Log-probabilities (and entropy) of ``hidden @ weight.T / T`` without materialising the ``[N, V]`` logits.

``logits = hidden @ weight.T`` (``hidden [N, H]``, ``weight [V, H]``, i.e. an LM head) is computed one tile at a
time and reduced to per-token ``lse``, ``log p(label)`` and entropy; backward recomputes each tile and turns it
into ``d logits`` with the formulas of :mod:`kernels.logprobs`, then into

.. math::

    \frac{\partial L}{\partial \mathrm{hidden}} = \sum_{\text{vocab tiles}} dZ\,W_v, \qquad
    \frac{\partial L}{\partial W_v} = \sum_{\text{token tiles}} dZ^\top \mathrm{hidden}_c .

Triton backend (chunked design): tiles of ``chunk_size`` tokens x ``vocab_chunk_size`` vocabulary entries;
each tile is one cuBLAS GEMM (in the input dtype, fp32 accumulation) followed by the Triton log-prob kernel of
:mod:`kernels.logprobs` (forward) or its backward kernel writing ``d logits`` in place into the tile. Vocabulary
tiles of one token chunk are merged exactly:

.. math::

    \mathrm{lse} = \log\sum_v e^{\mathrm{lse}_v}, \quad w_v = e^{\mathrm{lse}_v - \mathrm{lse}}, \quad
    H = \sum_v w_v\,(H_v - \log w_v), \quad \log p_y = z_y - \mathrm{lse} .

Extra memory (beyond inputs and the gradients themselves) is bounded independently of ``N`` and ``V``:
forward ``C·Vc`` logits elements for one tile; backward the same tile (reused in place for ``d logits``), one
fp32 ``[C, H]`` accumulator for ``d hidden`` and one ``[C, H]`` GEMM output. With the defaults (C = 2048,
Vc = 16384, bf16, H = 4096) that is about 112 MiB, against 4.6 GiB for bf16 logits at N = 16384, V = 151936.
``d weight`` is accumulated in the weight's dtype, rounded once per token chunk (each chunk's GEMM accumulates
in fp32).

torch twin: the same but chunked over tokens only (whole vocabulary per chunk, ``chunk_size`` tokens) with the
torch twin of the log-prob op, recomputing each chunk's logits in backward.

Conventions as in :func:`kernels.logprobs.logprobs_from_logits`: ``ignore_index`` rows get ``logp = 0`` and no
log-prob gradient; entropy is computed for every row.
"""
from __future__ import annotations

import torch

from ._utils import FLOAT_DTYPES, check_labels
from .dispatch import resolve_backend
from .logprobs import (
    _logprobs_fwd_kernel,
    logprobs_bwd_torch,
    logprobs_bwd_triton,
    logprobs_fwd_torch,
    logprobs_fwd_triton,
)

__all__ = ["fused_linear_logprobs", "DEFAULT_CHUNK_SIZE", "DEFAULT_VOCAB_CHUNK_SIZE", "TWIN_TILE_ELEMENTS"]

DEFAULT_CHUNK_SIZE = 2048
DEFAULT_VOCAB_CHUNK_SIZE = 16384
TWIN_TILE_ELEMENTS = 2**25
"""Logits per tile of the torch twin (128 MiB in fp32): 220 tokens at a 151,936-token vocabulary."""


def _vocab_labels(labels: torch.Tensor, v0: int, v1: int) -> torch.Tensor:
    """Labels relative to the vocabulary slice ``[v0, v1)``; -1 where the label is not in the slice."""
    inside = (labels >= v0) & (labels < v1)
    return torch.where(inside, labels - v0, torch.full_like(labels, -1))


# --------------------------------------------------------------------------------------------------------------
# Triton backend: token x vocabulary tiles, GEMM + Triton log-prob kernel per tile
# --------------------------------------------------------------------------------------------------------------
def _tile_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``h @ w.T (+ b)`` for one tile, in the input dtype (fp32 accumulation inside the GEMM)."""
    return h @ w.t() if b is None else torch.addmm(b, h, w.t())


def _fwd_triton(hidden, weight, bias, labels, inv_temp, with_entropy, chunk_size, vocab_chunk_size):
    n_tok = hidden.shape[0]
    n_voc = weight.shape[0]
    dev = hidden.device
    logp = torch.empty(n_tok, dtype=torch.float32, device=dev)
    lse = torch.empty(n_tok, dtype=torch.float32, device=dev)
    entropy = torch.empty(n_tok, dtype=torch.float32, device=dev) if with_entropy else None
    for s in range(0, n_tok, chunk_size):
        e = min(s + chunk_size, n_tok)
        h_c = hidden[s:e]
        lab_c = labels[s:e]
        run_lse = run_ent = z_y = None
        for v0 in range(0, n_voc, vocab_chunk_size):
            v1 = min(v0 + vocab_chunk_size, n_voc)
            z = _tile_logits(h_c, weight[v0:v1], None if bias is None else bias[v0:v1])
            lab_v = _vocab_labels(lab_c, v0, v1)
            logp_v, ent_v, lse_v = logprobs_fwd_triton(z, lab_v, inv_temp, with_entropy)
            del z
            zy_v = logp_v + lse_v  # z_y / T where the label is in this slice, as seen by the kernel
            if run_lse is None:
                run_lse, run_ent = lse_v, ent_v
                z_y = torch.where(lab_v >= 0, zy_v, torch.zeros_like(zy_v))
                continue
            new_lse = torch.logaddexp(run_lse, lse_v)
            if with_entropy:
                da, db = run_lse - new_lse, lse_v - new_lse  # log w_a, log w_b (both <= 0)
                run_ent = da.exp() * (run_ent - da) + db.exp() * (ent_v - db)
            z_y = torch.where(lab_v >= 0, zy_v, z_y)
            run_lse = new_lse
        lse[s:e] = run_lse
        logp[s:e] = torch.where(lab_c >= 0, z_y - run_lse, torch.zeros_like(run_lse))
        if with_entropy:
            entropy[s:e] = run_ent
    return logp, entropy, lse


def _bwd_triton(hidden, weight, bias, labels, lse, entropy, dlogp, dentropy, inv_temp, chunk_size, vocab_chunk_size,
                need_dh, need_dw, need_db):
    n_tok, n_hid = hidden.shape
    n_voc = weight.shape[0]
    d_hidden = torch.empty_like(hidden) if need_dh else None
    d_weight = torch.zeros_like(weight) if need_dw else None
    d_bias = torch.zeros(n_voc, dtype=torch.float32, device=hidden.device) if need_db else None
    for s in range(0, n_tok, chunk_size):
        e = min(s + chunk_size, n_tok)
        h_c = hidden[s:e]
        lab_c = labels[s:e]
        g_c = dlogp[s:e] if dlogp is not None else None
        dh_ent = dentropy[s:e] if dentropy is not None else None
        ent_c = entropy[s:e] if entropy is not None else None
        acc = torch.zeros((e - s, n_hid), dtype=torch.float32, device=hidden.device) if need_dh else None
        for v0 in range(0, n_voc, vocab_chunk_size):
            v1 = min(v0 + vocab_chunk_size, n_voc)
            w_v = weight[v0:v1]
            z = _tile_logits(h_c, w_v, None if bias is None else bias[v0:v1])
            dz = logprobs_bwd_triton(z, _vocab_labels(lab_c, v0, v1), lse[s:e], ent_c, g_c, dh_ent, inv_temp, out=z)
            if need_dh:
                acc += dz @ w_v
            if need_dw:
                d_weight[v0:v1].addmm_(dz.t(), h_c)
            if need_db:
                d_bias[v0:v1] += dz.sum(dim=0, dtype=torch.float32)
            del z, dz
        if need_dh:
            d_hidden[s:e] = acc
    return d_hidden, d_weight, None if d_bias is None else d_bias.to(bias.dtype)


# --------------------------------------------------------------------------------------------------------------
# torch twin: token chunks, whole vocabulary per chunk, recompute in backward
# --------------------------------------------------------------------------------------------------------------
def _fwd_torch(hidden, weight, bias, labels, inv_temp, with_entropy, chunk_size):
    n_tok = hidden.shape[0]
    cdt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    dev = hidden.device
    logp = torch.empty(n_tok, dtype=cdt, device=dev)
    lse = torch.empty(n_tok, dtype=cdt, device=dev)
    entropy = torch.empty(n_tok, dtype=cdt, device=dev) if with_entropy else None
    for s in range(0, n_tok, chunk_size):
        e = min(s + chunk_size, n_tok)
        z = _tile_logits(hidden[s:e], weight, bias)
        logprobs_fwd_torch(
            z, labels[s:e], inv_temp, with_entropy,
            out_logp=logp[s:e], out_lse=lse[s:e], out_entropy=entropy[s:e] if with_entropy else None,
        )
    return logp, entropy, lse


def _bwd_torch(hidden, weight, bias, labels, lse, entropy, dlogp, dentropy, inv_temp, chunk_size, need_dh, need_dw,
               need_db):
    n_tok = hidden.shape[0]
    d_hidden = torch.empty_like(hidden) if need_dh else None
    d_weight = torch.zeros_like(weight) if need_dw else None
    d_bias = torch.zeros(weight.shape[0], dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32,
                         device=hidden.device) if need_db else None
    for s in range(0, n_tok, chunk_size):
        e = min(s + chunk_size, n_tok)
        h_c = hidden[s:e]
        z = _tile_logits(h_c, weight, bias)
        dz = logprobs_bwd_torch(
            z, labels[s:e], lse[s:e],
            entropy[s:e] if entropy is not None else None,
            dlogp[s:e] if dlogp is not None else None,
            dentropy[s:e] if dentropy is not None else None,
            inv_temp, out=z,
        )
        if need_dh:
            d_hidden[s:e] = dz @ weight
        if need_dw:
            d_weight.addmm_(dz.t(), h_c)
        if need_db:
            d_bias += dz.sum(dim=0, dtype=d_bias.dtype)
        del z, dz
    return d_hidden, d_weight, None if d_bias is None else d_bias.to(bias.dtype)


# --------------------------------------------------------------------------------------------------------------
# autograd + public function
# --------------------------------------------------------------------------------------------------------------
class _FusedLinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, local_labels, inv_temp, with_entropy, backend, chunk_size,
                vocab_chunk_size):
        if backend == "triton":
            logp, entropy, lse = _fwd_triton(hidden, weight, bias, local_labels, inv_temp, with_entropy, chunk_size,
                                             vocab_chunk_size)
        else:
            logp, entropy, lse = _fwd_torch(hidden, weight, bias, local_labels, inv_temp, with_entropy, chunk_size)
        ctx.save_for_backward(hidden, weight, bias, local_labels, lse, entropy if with_entropy else lse)
        ctx.cfg = (inv_temp, with_entropy, backend, chunk_size, vocab_chunk_size)
        ctx.set_materialize_grads(False)
        if with_entropy:
            return logp, entropy
        return logp

    @staticmethod
    def backward(ctx, dlogp, dentropy=None):
        hidden, weight, bias, local_labels, lse, entropy = ctx.saved_tensors
        inv_temp, with_entropy, backend, chunk_size, vocab_chunk_size = ctx.cfg
        if not with_entropy:
            entropy = dentropy = None
        need_dh, need_dw, need_db = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if (dlogp is None and dentropy is None) or not (need_dh or need_dw or need_db):
            return (None,) * 9
        if dlogp is not None:
            dlogp = torch.where(local_labels >= 0, dlogp, torch.zeros_like(dlogp)).contiguous()
        if dentropy is not None:
            dentropy = dentropy.contiguous()
        if backend == "triton":
            d_hidden, d_weight, d_bias = _bwd_triton(hidden, weight, bias, local_labels, lse, entropy, dlogp, dentropy,
                                                     inv_temp, chunk_size, vocab_chunk_size, need_dh, need_dw,
                                                     need_db)
        else:
            d_hidden, d_weight, d_bias = _bwd_torch(hidden, weight, bias, local_labels, lse, entropy, dlogp, dentropy,
                                                    inv_temp, chunk_size, need_dh, need_dw, need_db)
        return d_hidden, d_weight, d_bias, None, None, None, None, None, None


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
    backend: str = "auto",
    chunk_size: int | None = None,
    vocab_chunk_size: int = DEFAULT_VOCAB_CHUNK_SIZE,
    bias: torch.Tensor | None = None,
):
    """``log softmax((hidden @ weight.T + bias) / T)[label]`` (and entropy) with bounded extra memory.

    Args:
        hidden: ``[N, H]`` bf16/fp16/fp32 (fp64 on the torch backend).
        weight: ``[V, H]``, same dtype and device as ``hidden``.
        labels: ``[N]`` integer ids in ``[0, V)`` or ``ignore_index``.
        temperature: positive; logits are divided by it.
        return_entropy: also return the per-token entropy.
        ignore_index: label of rows without a target (``logp = 0``, no log-prob gradient).
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.
        bias: optional ``[V]`` output bias (an LM head with a bias); receives its gradient.
        chunk_size: tokens per tile; ``None``: :data:`DEFAULT_CHUNK_SIZE` on the Triton backend, and on the torch
            twin (whole vocabulary per tile) as many tokens as keep a tile at :data:`TWIN_TILE_ELEMENTS` logits.
        vocab_chunk_size: vocabulary entries per tile (Triton backend; the torch twin uses the whole vocabulary).

    Returns:
        ``(logp[N], entropy[N] | None)`` in fp32 (fp64 for fp64 inputs on the torch backend). Gradients flow to
        ``hidden`` and ``weight``.
    """
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be [V, {hidden.shape[1]}], got shape {tuple(weight.shape)}")
    if weight.shape[0] == 0:
        raise ValueError("weight must have at least one vocabulary row")
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(
            f"weight ({weight.dtype}, {weight.device}) must match hidden ({hidden.dtype}, {hidden.device})"
        )
    if not (temperature > 0):
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and int(chunk_size) <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if int(vocab_chunk_size) <= 0:
        raise ValueError(f"vocab_chunk_size must be positive, got {vocab_chunk_size}")
    n_tok, n_voc = hidden.shape[0], weight.shape[0]
    check_labels(labels, n_tok, n_voc, ignore_index)
    if labels.device != hidden.device:
        raise ValueError(f"labels are on {labels.device} but hidden on {hidden.device}")
    chosen = resolve_backend(backend, hidden, _logprobs_fwd_kernel)
    allowed = FLOAT_DTYPES if chosen == "triton" else FLOAT_DTYPES + (torch.float64,)
    if hidden.dtype not in allowed:
        raise ValueError(f"hidden dtype {hidden.dtype} is not supported by the {chosen} backend (use one of {allowed})")
    if bias is not None and (bias.shape != (n_voc,) or bias.dtype != weight.dtype or bias.device != weight.device):
        raise ValueError(f"bias must be [{n_voc}] with the weight's dtype and device, got "
                         f"{tuple(bias.shape)} {bias.dtype} {bias.device}")
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK_SIZE if chosen == "triton" else \
            max(16, min(DEFAULT_CHUNK_SIZE, TWIN_TILE_ELEMENTS // n_voc))
    local_labels = torch.where(labels == ignore_index, torch.full_like(labels, -1), labels).long().contiguous()
    out = _FusedLinearLogprobs.apply(
        hidden, weight, bias, local_labels, 1.0 / float(temperature), bool(return_entropy), chosen, int(chunk_size),
        int(vocab_chunk_size),
    )
    if return_entropy:
        return out[0], out[1]
    return out, None
