"""The algorithms are device-agnostic: on a CUDA device they give the CPU float64 results (skipped without one)."""
import pytest
import torch

from openrlhf_hacpo.algorithms import (
    AdvantageConfig,
    PolicyLossConfig,
    PolicyLossInput,
    compute_advantages,
    get_policy_loss,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def batch(device, dtype):
    gen = torch.Generator().manual_seed(0)
    rows, width = 64, 16
    rewards = (torch.rand(rows, generator=gen) < 0.5).to(torch.float64)
    prompt_ids = torch.arange(rows) // 8
    sources = torch.arange(rows) % 2
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    logp = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 2
    mean = (logp * mask).sum(1) / lengths
    old = mean - torch.randn(rows, generator=gen, dtype=torch.float64) * 0.1
    ref = logp + 0.1 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    to = dict(device=device, dtype=dtype)
    return (rewards.to(**to), prompt_ids.to(device), sources.to(device), logp.to(**to), mask.to(device),
            old.to(**to), ref.to(**to))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["hacpo", "naive"])
def test_cuda_matches_cpu(dtype, name):
    results = []
    for device in ("cpu", "cuda"):
        rewards, prompt_ids, sources, logp, mask, old, ref = batch(device, dtype)
        omega = torch.tensor([1.0, 0.6], device=device, dtype=dtype)
        adv = compute_advantages(rewards, prompt_ids, sources, 0, omega, AdvantageConfig())
        coef = torch.where(sources == 0, 1.0, 1 / 0.6).to(dtype)
        logp = logp.clone().requires_grad_(True)
        out = get_policy_loss(name)(
            PolicyLossInput(logp=logp, mask=mask, advantages=adv.advantages, old_logp_mean=old, is_own=sources == 0,
                            coef=coef, update_index=1, ref_logp=ref),
            PolicyLossConfig(),
        )
        out.loss.backward()
        assert out.loss.device.type == device and adv.advantages.device.type == device
        results.append((adv.advantages.cpu(), out.loss.detach().cpu(), logp.grad.cpu(), out.metrics))
    (a_cpu, l_cpu, g_cpu, m_cpu), (a_gpu, l_gpu, g_gpu, m_gpu) = results
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a_gpu, a_cpu, **tol)
    torch.testing.assert_close(l_gpu, l_cpu, **tol)
    torch.testing.assert_close(g_gpu, g_cpu, **tol)
    assert m_gpu.keys() == m_cpu.keys()
