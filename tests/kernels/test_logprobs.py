"""logprobs_from_logits: Triton kernel and torch twin against a float64 autograd reference."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import (DEVICES, TOL, TRITON_ON_CPU, assert_finite, assert_rel_close, poisoned_allocations,
                           skip_unless_runnable)
from hacpo_kernels import logprobs_from_logits
from hacpo_kernels.logprobs import logprobs_bwd_torch, logprobs_bwd_triton, logprobs_fwd_torch, logprobs_fwd_triton

BACKENDS = ["triton", "torch"]
N, V = 37, 1031
IGNORE = -100


def make_inputs(device, dtype, n=N, v=V, scale=3.0, n_ignored=4, row_pad=0):
    """Random logits (optionally rows of a wider buffer, i.e. a row stride > V) and labels with ignored rows."""
    full = torch.randn(n, v + row_pad, device=device, dtype=torch.float32) * scale
    logits = full.to(dtype)[:, :v]
    labels = torch.randint(0, v, (n,), device=device)
    labels[torch.randperm(n, device=device)[:n_ignored]] = IGNORE
    return logits, labels


def reference(logits, labels, temperature):
    """float64 log-probs / entropy and their autograd graph (leaf returned for gradients)."""
    x = logits.detach().double().requires_grad_()
    lp = torch.log_softmax(x / temperature, dim=-1)
    finite_lp = torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))  # p log p = 0 where p = 0
    entropy = -(lp.exp() * finite_lp).sum(dim=-1)
    valid = labels != IGNORE
    logp = torch.where(valid, lp.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1), torch.zeros_like(entropy))
    return x, logp, entropy


def reference_grad(x, logp, entropy, g_logp, g_ent):
    loss = (logp * g_logp).sum() + (entropy * g_ent).sum()
    (grad,) = torch.autograd.grad(loss, x, retain_graph=True)
    return grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_float64_reference(device, backend, dtype, temperature):
    skip_unless_runnable(backend, device)
    logits, labels = make_inputs(device, dtype, row_pad=13 if dtype == torch.bfloat16 else 0)
    x, ref_logp, ref_ent = reference(logits, labels, temperature)
    g_logp = torch.randn(N, dtype=torch.float64, device=device)
    g_ent = torch.randn(N, dtype=torch.float64, device=device)
    ref_grad = reference_grad(x, ref_logp, ref_ent, g_logp, g_ent)

    inp = logits.detach().requires_grad_()
    with poisoned_allocations():
        logp, ent = logprobs_from_logits(inp, labels, temperature, return_entropy=True, backend=backend)
        ((logp.double() * g_logp).sum() + (ent.double() * g_ent).sum()).backward()
    tol = TOL[dtype]
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    assert_rel_close(logp, ref_logp, tol, f"logp[{backend},{dtype}]")
    assert_rel_close(ent, ref_ent, tol, f"entropy[{backend},{dtype}]")
    assert inp.grad.dtype == dtype
    assert_rel_close(inp.grad, ref_grad, tol, f"dlogits[{backend},{dtype}]")
    ignored = labels == IGNORE
    assert torch.all(logp[ignored] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_logp_only_and_entropy_only_gradients(device, backend):
    skip_unless_runnable(backend, device)
    logits, labels = make_inputs(device, torch.float32)
    x, ref_logp, ref_ent = reference(logits, labels, 1.0)
    g = torch.randn(N, dtype=torch.float64, device=device)

    inp = logits.detach().requires_grad_()
    logp, ent = logprobs_from_logits(inp, labels, return_entropy=False, backend=backend)
    assert ent is None
    (logp.double() * g).sum().backward()
    assert_rel_close(inp.grad, reference_grad(x, ref_logp, ref_ent, g, torch.zeros_like(g)), TOL[torch.float32],
                     f"dlogits from logp only [{backend}]")
    # ignored rows get no gradient at all when only logp is used
    assert torch.all(inp.grad[labels == IGNORE] == 0)

    inp = logits.detach().requires_grad_()
    logp, ent = logprobs_from_logits(inp, labels, return_entropy=True, backend=backend)
    (ent.double() * g).sum().backward()
    assert_rel_close(inp.grad, reference_grad(x, ref_logp, ref_ent, torch.zeros_like(g), g), TOL[torch.float32],
                     f"dlogits from entropy only [{backend}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inplace_backward_writes_gradient_into_logits(device, backend, dtype):
    skip_unless_runnable(backend, device)
    logits, labels = make_inputs(device, dtype)
    x, ref_logp, ref_ent = reference(logits, labels, 0.7)
    g_logp = torch.randn(N, dtype=torch.float64, device=device)
    g_ent = torch.randn(N, dtype=torch.float64, device=device)
    ref_grad = reference_grad(x, ref_logp, ref_ent, g_logp, g_ent)

    leaf = logits.detach().clone().requires_grad_()
    buffer = leaf * 1.0  # non-leaf logits buffer, as produced by an LM head
    logp, ent = logprobs_from_logits(buffer, labels, 0.7, return_entropy=True, inplace_backward=True,
                                     backend=backend)
    ((logp.double() * g_logp).sum() + (ent.double() * g_ent).sum()).backward()
    assert_rel_close(leaf.grad, ref_grad, TOL[dtype], f"in-place dlogits [{backend},{dtype}]")
    assert torch.equal(buffer.detach(), leaf.grad), "gradient was not written into the logits buffer"


@pytest.mark.parametrize("device", DEVICES)
def test_triton_tiles_write_every_output(device):
    """Several vocabulary tiles (BLOCK_V=256 over V=1031), outputs and d logits pre-filled with NaN."""
    skip_unless_runnable("triton", device)
    logits, labels = make_inputs(device, torch.bfloat16, row_pad=5)
    local = torch.where(labels == IGNORE, -1, labels)
    x, ref_logp, ref_ent = reference(logits, labels, 1.3)
    nan = torch.full((N,), float("nan"), device=device)
    logp, ent, lse = logprobs_fwd_triton(logits, local, 1 / 1.3, True, out_logp=nan.clone(), out_entropy=nan.clone(),
                                         out_lse=nan.clone(), block_v=256)
    assert_rel_close(logp, ref_logp, TOL[torch.bfloat16], "logp (tiles)")
    assert_rel_close(ent, ref_ent, TOL[torch.bfloat16], "entropy (tiles)")
    assert_rel_close(lse, torch.logsumexp(logits.double() / 1.3, dim=-1), 1e-6, "lse (tiles)")

    g = torch.where(labels == IGNORE, 0.0, torch.randn(N, device=device))
    h = torch.randn(N, device=device)
    out = torch.full((N, V), float("nan"), device=device, dtype=torch.bfloat16)
    dlogits = logprobs_bwd_triton(logits, local, lse, ent, g, h, 1 / 1.3, out=out, block_v=256)
    ref_grad = reference_grad(x, ref_logp, ref_ent, g.double(), h.double())
    assert_rel_close(dlogits, ref_grad, TOL[torch.bfloat16], "dlogits (tiles)")


@pytest.mark.parametrize("device", DEVICES)
def test_torch_twin_row_chunks(device):
    """The twin's row chunking (3 rows per chunk) gives the same numbers as one chunk."""
    logits, labels = make_inputs(device, torch.float32)
    local = torch.where(labels == IGNORE, -1, labels)
    a = logprobs_fwd_torch(logits, local, 1.0, True, chunk_rows=3)
    b = logprobs_fwd_torch(logits, local, 1.0, True, chunk_rows=N)
    for u, w in zip(a, b):
        assert_rel_close(u, w, 1e-6, "twin chunking (forward)")
    g, h = torch.randn(N, device=device), torch.randn(N, device=device)
    g = torch.where(local < 0, 0.0, g)
    da = logprobs_bwd_torch(logits, local, a[2], a[1], g, h, 1.0, chunk_rows=3)
    db = logprobs_bwd_torch(logits, local, b[2], b[1], g, h, 1.0, chunk_rows=N)
    assert_rel_close(da, db, 1e-6, "twin chunking (backward)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_large_logits_entropy_is_accurate(device, backend):
    """Logits around 2e4: the shift-invariant accumulator keeps the entropy accurate in fp32."""
    skip_unless_runnable(backend, device)
    logits, labels = make_inputs(device, torch.float32, scale=2.0)
    logits = logits + 2.0e4
    _, ref_logp, ref_ent = reference(logits, labels, 1.0)
    logp, ent = logprobs_from_logits(logits, labels, return_entropy=True, backend=backend)
    assert_rel_close(ent, ref_ent, 1e-5, f"entropy at large logits [{backend}]")
    assert_rel_close(logp, ref_logp, 1e-5, f"logp at large logits [{backend}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_inf_logits(device, backend):
    """Masked vocabulary entries (-inf logits) are allowed and never produce NaN."""
    skip_unless_runnable(backend, device)
    logits, labels = make_inputs(device, torch.float32)
    logits[:, ::7] = float("-inf")
    labels = torch.where(labels % 7 == 0, labels + 1, labels)  # never a -inf target (V - 1 = 1030 is not 0 mod 7)
    labels[0] = IGNORE
    x, ref_logp, ref_ent = reference(logits, labels, 1.0)
    g, h = torch.randn(N, dtype=torch.float64, device=device), torch.randn(N, dtype=torch.float64, device=device)
    ref_grad = reference_grad(x, ref_logp, ref_ent, g, h)
    inp = logits.detach().requires_grad_()
    logp, ent = logprobs_from_logits(inp, labels, return_entropy=True, backend=backend)
    ((logp.double() * g).sum() + (ent.double() * h).sum()).backward()
    assert_rel_close(logp, ref_logp, 1e-5, "logp with -inf logits")
    assert_rel_close(ent, ref_ent, 1e-5, "entropy with -inf logits")
    assert_rel_close(inp.grad, ref_grad, 1e-5, "dlogits with -inf logits")


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend):
    skip_unless_runnable(backend, "cpu")
    logits = torch.randn(0, 11, requires_grad=True)
    logp, ent = logprobs_from_logits(logits, torch.zeros(0, dtype=torch.long), return_entropy=True, backend=backend)
    assert logp.shape == (0,) and ent.shape == (0,)
    (logp.sum() + ent.sum()).backward()
    assert logits.grad.shape == (0, 11)


def test_bad_inputs_raise_clear_errors():
    logits = torch.randn(4, 10)
    with pytest.raises(ValueError, match="labels\\[2\\] = 10"):
        logprobs_from_logits(logits, torch.tensor([0, 1, 10, 3]))
    with pytest.raises(ValueError, match="labels must have shape"):
        logprobs_from_logits(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer"):
        logprobs_from_logits(logits, torch.zeros(4))
    with pytest.raises(ValueError, match="2-D"):
        logprobs_from_logits(logits[None], torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, torch.zeros(4, dtype=torch.long), temperature=0.0)
    if TRITON_ON_CPU:
        with pytest.raises(ValueError, match="float64"):
            logprobs_from_logits(logits.double(), torch.zeros(4, dtype=torch.long), backend="triton")
    with pytest.raises(ValueError, match="backend"):
        logprobs_from_logits(logits, torch.zeros(4, dtype=torch.long), backend="cuda")


def test_float64_twin_matches_reference():
    logits, labels = make_inputs("cpu", torch.float64)
    x, ref_logp, ref_ent = reference(logits, labels, 0.7)
    logp, ent = logprobs_from_logits(logits, labels, 0.7, return_entropy=True, backend="torch")
    assert logp.dtype == torch.float64
    assert_rel_close(logp, ref_logp, 1e-12, "fp64 twin logp")
    assert_rel_close(ent, ref_ent, 1e-12, "fp64 twin entropy")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_shape_cuda():
    """Real vocabulary size: Triton vs a float64 reference computed in row chunks."""
    n, v = 2048, 151936
    logits, labels = make_inputs("cuda", torch.bfloat16, n=n, v=v, n_ignored=64)
    g, h = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    inp = logits.detach().requires_grad_()
    logp, ent = logprobs_from_logits(inp, labels, 0.9, return_entropy=True, backend="triton")
    (logp * g + ent * h).sum().backward()
    assert_finite(inp.grad, "dlogits")
    ref_logp, ref_ent, ref_grad = [], [], []
    for s in range(0, n, 256):
        x, lp_, en_ = reference(logits[s:s + 256], labels[s:s + 256], 0.9)
        ref_logp.append(lp_.detach())
        ref_ent.append(en_.detach())
        ref_grad.append(reference_grad(x, lp_, en_, g[s:s + 256].double(), h[s:s + 256].double()).float())
    assert_rel_close(logp, torch.cat(ref_logp), TOL[torch.bfloat16], "logp (large)")
    assert_rel_close(ent, torch.cat(ref_ent), TOL[torch.bfloat16], "entropy (large)")
    assert_rel_close(inp.grad, torch.cat(ref_grad), TOL[torch.bfloat16], "dlogits (large)")
