"""fused_linear_logprobs: Triton (tiled) and torch twin (token chunks) against float64 autograd."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICES, TOL, assert_rel_close, poisoned_allocations, skip_unless_runnable
from hacpo_kernels import fused_linear_logprobs

N, H, V = 37, 48, 1031
IGNORE = -100
# bf16 gradients go through three bf16 roundings (logits tile, d logits tile, GEMM output): allow 2e-2 there
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_inputs(device, dtype, n=N, h=H, v=V):
    hidden = torch.randn(n, h, device=device).to(dtype)
    weight = (torch.randn(v, h, device=device) * h**-0.5 * 2.0).to(dtype)
    labels = torch.randint(0, v, (n,), device=device)
    labels[torch.randperm(n, device=device)[:3]] = IGNORE
    return hidden, weight, labels


def reference(hidden, weight, labels, temperature, g_logp, g_ent):
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    lp = torch.log_softmax(h @ w.t() / temperature, dim=-1)
    ent = -(lp.exp() * lp).sum(dim=-1)
    valid = labels != IGNORE
    logp = torch.where(valid, lp.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1), torch.zeros_like(ent))
    dh, dw = torch.autograd.grad((logp * g_logp).sum() + (ent * g_ent).sum(), (h, w))
    return logp.detach(), ent.detach(), dh, dw


TILINGS = {
    "tiles": dict(chunk_size=16, vocab_chunk_size=300),  # 3 token chunks x 4 vocabulary chunks (last ones ragged)
    "default": {},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tiling", list(TILINGS))
def test_matches_float64_reference(device, backend, dtype, temperature, tiling):
    skip_unless_runnable(backend, device)
    hidden, weight, labels = make_inputs(device, dtype)
    g_logp = torch.randn(N, dtype=torch.float64, device=device)
    g_ent = torch.randn(N, dtype=torch.float64, device=device)
    ref_logp, ref_ent, ref_dh, ref_dw = reference(hidden, weight, labels, temperature, g_logp, g_ent)

    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_()
    with poisoned_allocations():
        logp, ent = fused_linear_logprobs(h, w, labels, temperature, return_entropy=True, backend=backend,
                                          **TILINGS[tiling])
        ((logp.double() * g_logp).sum() + (ent.double() * g_ent).sum()).backward()
    tag = f"[{backend},{dtype},{tiling}]"
    assert_rel_close(logp, ref_logp, TOL[dtype], f"logp {tag}")
    assert_rel_close(ent, ref_ent, TOL[dtype], f"entropy {tag}")
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    assert_rel_close(h.grad, ref_dh, GRAD_TOL[dtype], f"d hidden {tag}")
    assert_rel_close(w.grad, ref_dw, GRAD_TOL[dtype], f"d weight {tag}")
    assert torch.all(logp[labels == IGNORE] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_frozen_weight_and_logp_only(device, backend):
    skip_unless_runnable(backend, device)
    hidden, weight, labels = make_inputs(device, torch.float32)
    g = torch.randn(N, dtype=torch.float64, device=device)
    ref_logp, _, ref_dh, _ = reference(hidden, weight, labels, 1.0, g, torch.zeros_like(g))
    h = hidden.detach().requires_grad_()
    logp, ent = fused_linear_logprobs(h, weight, labels, backend=backend, chunk_size=8, vocab_chunk_size=512)
    assert ent is None
    (logp.double() * g).sum().backward()
    assert weight.grad is None
    assert_rel_close(logp, ref_logp, 1e-5, "logp")
    assert_rel_close(h.grad, ref_dh, 1e-5, "d hidden (frozen weight)")


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bad_inputs_raise_clear_errors(backend):
    skip_unless_runnable(backend, "cpu")
    hidden, weight, labels = make_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="weight must be"):
        fused_linear_logprobs(hidden, weight[:, :5], labels, backend=backend)
    with pytest.raises(ValueError, match="must match hidden"):
        fused_linear_logprobs(hidden, weight.double(), labels, backend=backend)
    with pytest.raises(ValueError, match="chunk_size"):
        fused_linear_logprobs(hidden, weight, labels, backend=backend, chunk_size=0)
    with pytest.raises(ValueError, match="labels\\["):
        fused_linear_logprobs(hidden, weight, torch.full((N,), V), backend=backend)


def test_float64_twin_matches_reference():
    hidden, weight, labels = make_inputs("cpu", torch.float64)
    g, e = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    ref_logp, ref_ent, ref_dh, ref_dw = reference(hidden, weight, labels, 0.7, g, e)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = fused_linear_logprobs(h, w, labels, 0.7, return_entropy=True, backend="torch", chunk_size=10)
    ((logp * g).sum() + (ent * e).sum()).backward()
    for out, ref, name in ((logp, ref_logp, "logp"), (ent, ref_ent, "entropy"), (h.grad, ref_dh, "d hidden"),
                           (w.grad, ref_dw, "d weight")):
        assert_rel_close(out, ref, 1e-12, f"fp64 twin {name}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_shape_cuda_memory_and_accuracy():
    """H=4096, V=32000, N=4096 bf16: matches the twin and never holds the full logits."""
    n, h_dim, v = 4096, 4096, 32000
    hidden, weight, labels = make_inputs("cuda", torch.bfloat16, n=n, h=h_dim, v=v)
    g, e = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    outs = {}
    for backend in ("triton", "torch"):
        h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logp, ent = fused_linear_logprobs(h, w, labels, return_entropy=True, backend=backend, chunk_size=1024,
                                          vocab_chunk_size=8192)
        (logp * g + ent * e).sum().backward()
        torch.cuda.synchronize()
        peak_extra = torch.cuda.max_memory_allocated() - base - h.grad.nbytes - w.grad.nbytes
        outs[backend] = (logp.detach(), ent.detach(), h.grad, w.grad, peak_extra)
    full_logits_bytes = n * v * 2
    assert outs["triton"][4] < 0.25 * full_logits_bytes
    for i, name in enumerate(("logp", "entropy", "d hidden", "d weight")):
        assert_rel_close(outs["triton"][i], outs["torch"][i], 2e-2, f"{name} triton vs twin (large)")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_matches_float64_reference(backend, dtype):
    """An LM head with a bias: logits = hidden @ weight.T + bias; the bias gets the summed d logits."""
    skip_unless_runnable(backend, "cpu")
    hidden, weight, labels = make_inputs("cpu", dtype)
    bias = (torch.randn(V) * 0.5).to(dtype)
    g_logp = torch.randn(N, dtype=torch.float64)
    g_ent = torch.randn(N, dtype=torch.float64)
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_()
    lp = torch.log_softmax((h64 @ w64.t() + b64) / 0.8, dim=-1)
    ent = -(lp.exp() * lp).sum(dim=-1)
    valid = labels != IGNORE
    ref_logp = torch.where(valid, lp.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1), torch.zeros_like(ent))
    ref_dh, ref_dw, ref_db = torch.autograd.grad((ref_logp * g_logp).sum() + (ent * g_ent).sum(), (h64, w64, b64))

    h, w, b = (x.detach().requires_grad_() for x in (hidden, weight, bias))
    logp, entropy = fused_linear_logprobs(h, w, labels, 0.8, return_entropy=True, backend=backend, bias=b,
                                          chunk_size=16, vocab_chunk_size=300)
    ((logp.double() * g_logp).sum() + (entropy.double() * g_ent).sum()).backward()
    tag = f"[{backend},{dtype}]"
    assert_rel_close(logp, ref_logp.detach(), TOL[dtype], f"logp {tag}")
    assert_rel_close(entropy, ent.detach(), TOL[dtype], f"entropy {tag}")
    assert_rel_close(h.grad, ref_dh, GRAD_TOL[dtype], f"d hidden {tag}")
    assert_rel_close(w.grad, ref_dw, GRAD_TOL[dtype], f"d weight {tag}")
    assert b.grad.dtype == dtype
    assert_rel_close(b.grad, ref_db, GRAD_TOL[dtype], f"d bias {tag}")
