"""Backend resolution: auto by device, environment override, clear errors."""
import pytest
import torch

from hacpo_kernels import dispatch, resolve_backend
from hacpo_kernels.logprobs import _logprobs_fwd_kernel


class _CompiledKernelStandIn:
    """Looks like a non-interpreted Triton kernel (its type is not InterpretedFunction)."""


def test_auto_picks_torch_for_cpu_tensors(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert resolve_backend("auto", torch.zeros(2)) == "torch"
    assert resolve_backend("torch", torch.zeros(2)) == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_picks_triton_for_cuda_tensors(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert resolve_backend("auto", torch.zeros(2, device="cuda")) == "triton"
    assert resolve_backend("auto", torch.zeros(2, device="cuda", dtype=torch.bfloat16)) == "triton"
    # the kernels take fp16/bf16/fp32; float64 goes to the twin, which computes in float64
    assert resolve_backend("auto", torch.zeros(2, device="cuda", dtype=torch.float64)) == "torch"


@pytest.mark.skipif(not dispatch.HAS_TRITON, reason="needs triton")
def test_explicit_triton_refuses_float64_with_the_dtype_named():
    from hacpo_kernels import LossParams, hacpo_loss

    if not (torch.cuda.is_available() or dispatch.interpreter_active(hacpo_loss.__globals__["_hacpo_fwd_kernel"])):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logp = torch.zeros(2, 3, dtype=torch.float64, device=device)
    vec = torch.zeros(2, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="logp dtype torch.float64 is not supported by the triton backend"):
        hacpo_loss(logp, torch.ones(2, 3, device=device), vec, vec, torch.ones(2, dtype=torch.bool, device=device),
                   vec + 1, LossParams(), backend="triton")


def test_environment_overrides_auto_only(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    assert resolve_backend("auto", torch.zeros(2)) == "torch"
    monkeypatch.setenv(dispatch.ENV_VAR, "TRITON")
    if dispatch.interpreter_active(_logprobs_fwd_kernel):
        assert resolve_backend("auto", torch.zeros(2), _logprobs_fwd_kernel) == "triton"
    assert resolve_backend("torch", torch.zeros(2)) == "torch"  # an explicit argument wins
    monkeypatch.setenv(dispatch.ENV_VAR, "gpu")
    with pytest.raises(ValueError, match=dispatch.ENV_VAR):
        resolve_backend("auto", torch.zeros(2))


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", torch.zeros(2))


@pytest.mark.skipif(not dispatch.HAS_TRITON, reason="needs triton")
def test_triton_on_cpu_needs_the_interpreter():
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.zeros(2), _CompiledKernelStandIn())
    if dispatch.interpreter_active(_logprobs_fwd_kernel):
        assert resolve_backend("triton", torch.zeros(2), _logprobs_fwd_kernel) == "triton"


@pytest.mark.integration
def test_kernels_import_nothing_from_the_project():
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    code = ("import sys, hacpo_kernels; bad = [m for m in sys.modules if m.split('.')[0] == 'openrlhf_hacpo']; "
            "sys.exit(f'kernels imported {bad}' if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
