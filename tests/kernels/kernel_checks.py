"""Helpers shared by the kernel tests: devices, seeds, relative-error assertions, poisoned allocations."""
from __future__ import annotations

import contextlib
import os
import time

import pytest
import torch

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.logprobs import _logprobs_fwd_kernel

_SEED_ENV = os.environ.get("KERNEL_TEST_SEED", "20261130")
SEED = int(time.time()) % 100_000 if _SEED_ENV == "random" else int(_SEED_ENV)
"""Fixed by default, so a run is repeatable; ``KERNEL_TEST_SEED=random`` draws fresh inputs (the seed is printed in
the report header and in every assertion message), ``KERNEL_TEST_SEED=<n>`` reruns one."""

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

TRITON_ON_CPU = interpreter_active(_logprobs_fwd_kernel)
"""Triton kernels run on CPU tensors only under the interpreter (tests/conftest.py enables it without CUDA)."""


def skip_unless_runnable(backend: str, device: str) -> None:
    """Skip Triton-on-CPU cases on a GPU machine, where the kernels are compiled rather than interpreted."""
    if backend == "triton" and device == "cpu" and not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")


TOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 1e-2, torch.float16: 1e-2}
"""Relative-error bounds ||out - ref|| / ||ref|| against a float64 reference, by input dtype."""


def generator(device: str, salt: int = 0) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(SEED * 1000 + salt)
    return g


def assert_finite(x: torch.Tensor, name: str) -> None:
    bad = ~torch.isfinite(x.detach())
    if bool(bad.any()):
        idx = torch.nonzero(bad)[:5].tolist()
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite values (first at {idx}) [seed {SEED}]")


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = out.detach().double().cpu() - ref.detach().double().cpu()
    den = float(ref.detach().double().cpu().norm())
    return float(diff.norm()) / den if den > 0 else float(diff.norm())


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, tol: float, name: str) -> None:
    """Assert ``||out - ref|| / ||ref|| <= tol`` (absolute when ``ref`` is 0), NaN/inf never passing."""
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    assert_finite(out, name)
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    rel = rel_error(o, r)
    if not rel <= tol:
        diff = (o - r).abs()
        worst = int(diff.flatten().argmax()) if diff.numel() else 0
        raise AssertionError(
            f"{name}: relative error {rel:.3e} > {tol:.1e}; max abs diff {float(diff.max()):.3e} at flat index "
            f"{worst} (out {float(o.flatten()[worst]):.6g}, ref {float(r.flatten()[worst]):.6g}), "
            f"mean abs diff {float(diff.mean()):.3e} [seed {SEED}]"
        )


@contextlib.contextmanager
def poisoned_allocations():
    """Inside the block, ``torch.empty`` / ``torch.empty_like`` return NaN-filled floating tensors.

    Kernel outputs are allocated with them, so a kernel that leaves an element unwritten shows up as NaN.
    """
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        return t

    def empty(*args, **kwargs):
        return poison(real_empty(*args, **kwargs))

    def empty_like(*args, **kwargs):
        return poison(real_empty_like(*args, **kwargs))

    torch.empty, torch.empty_like = empty, empty_like
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


def assert_sum_close(out: torch.Tensor, ref: torch.Tensor, scale: float, tol: float, name: str) -> None:
    """Scalar sums of terms of either sign: ``|out - ref| <= tol * scale`` with ``scale`` the size of the terms.

    A relative error against the sum itself is meaningless when the terms cancel.
    """
    assert_finite(out, name)
    out, ref = float(torch.as_tensor(out, dtype=torch.float64).detach()), float(torch.as_tensor(ref, dtype=torch.float64).detach())
    diff = abs(out - ref)
    if not diff <= tol * scale:
        raise AssertionError(f"{name}: |{out:.8g} - {ref:.8g}| = {diff:.3e} > {tol:.1e} * "
                             f"{scale:.3e} [seed {SEED}]")


def hacpo_loss_kw(logp, mask, advantages, old_logp_mean, is_own, coef, *, old_logp=None, ref_logp=None,
                  backend="auto", **kw):
    """``hacpo_loss`` with its parameters given as keywords: the :class:`LossParams` fields and the
    :class:`LossTotals` counts (``num_seqs`` ...), for tests that sweep single parameters."""
    from dataclasses import fields

    from hacpo_kernels.hacpo_loss import LossParams, LossTotals, hacpo_loss

    total_names = {f.name for f in fields(LossTotals)}
    totals = LossTotals(**{k: v for k, v in kw.items() if k in total_names})
    params = LossParams(**{k: v for k, v in kw.items() if k not in total_names})
    return hacpo_loss(logp, mask, advantages, old_logp_mean, is_own, coef, params, old_logp=old_logp,
                      ref_logp=ref_logp, totals=totals, backend=backend)
