"""The trainer's real update path on both kernel backends: ``--kernel_backend triton`` (Triton's interpreter on
CPU tensors, which tests/conftest.py switches on without CUDA) against ``--kernel_backend torch`` (the twins).

One step (several updates m = 0, 1, ...) of two heterogeneous agents through the CLI (``--no_ray``: DeepSpeed ZeRO-2 on gloo in the test process),
for every registered loss, with the KL term on, token-level ratios and the pessimistic foreign rule: the loss,
the gradient norm and the updated weights of both agents must agree. Sampling does not involve the kernels, so
both runs train on the same rollouts.
"""
from __future__ import annotations

import pytest
import torch

from openrlhf_hacpo.cli.train_hacpo import run

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

CASES = {
    "hacpo_kl_pessimistic": ["--algorithm", "hacpo", "--init_kl_coef", "0.05", "--cross_clip_mode", "pessimistic"],
    "gspo_token_level": ["--algorithm", "gspo", "--ratio_level", "token", "--init_kl_coef", "0.05"],
    "gspo": ["--algorithm", "gspo"],
    "grpo": ["--algorithm", "grpo", "--init_kl_coef", "0.05"],
    "naive": ["--algorithm", "naive", "--loss_agg", "token-mean"],
}
LOSS_REL = 1e-5
"""fp32 kernels against fp32 twins: the same math in another summation order."""
GRAD_NORM_REL = 1e-4
WEIGHT_REL = 1e-3
"""Relative to the update itself (Adam's first step divides by |g|, which amplifies last-bit differences of
near-zero gradient entries)."""


def _weights(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_triton_and_torch_backends_give_the_same_update(tmp_path, tiny_agents, base_args, case):
    results = {}
    for backend in ("triton", "torch"):
        out = tmp_path / backend
        controller = run(base_args(out, "--no_ray", "--agent", f"name=qwen,pretrain={tiny_agents['qwen']}",
                                   "--agent", f"name=llama,pretrain={tiny_agents['llama']}",
                                   "--train_batch_size", "4", "--max_steps", "1", "--kernel_backend", backend,
                                   *CASES[case]))
        records = controller.history[-1]
        results[backend] = (records, {name: _weights(out / "hf" / name) for name in ("qwen", "llama")})
    (rec_t, w_t), (rec_c, w_c) = results["triton"], results["torch"]
    for agent, (a, b) in enumerate(zip(rec_t, rec_c)):
        assert a["loss"] == pytest.approx(b["loss"], rel=LOSS_REL, abs=1e-7), f"agent {agent} loss"
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=GRAD_NORM_REL), f"agent {agent} grad norm"
        assert a["grad_norm"] > 0
        assert a["policy/entropy"] == pytest.approx(b["policy/entropy"], rel=1e-5)
        if "--init_kl_coef" in CASES[case]:
            assert a["policy/kl"] == pytest.approx(b["policy/kl"], rel=1e-4, abs=1e-9)
    initial = {name: _weights(tiny_agents[name]) for name in ("qwen", "llama")}
    for name in ("qwen", "llama"):
        num = sum(float(((w_t[name][k] - w_c[name][k]) ** 2).sum()) for k in w_c[name]) ** 0.5
        den = sum(float(((w_c[name][k] - initial[name][k]) ** 2).sum()) for k in w_c[name]) ** 0.5
        assert den > 0, f"{name}: the update did not move the weights"
        assert num / den < WEIGHT_REL, f"{name}: updates differ by {num / den:.2e} of their size"
