"""The update loop without Ray or DeepSpeed: a tiny Llama, a plain engine with DeepSpeed's surface, hand-built rows.

Values are checked against an independent float64 forward of the same model: the entropy the loss reports, the
loss at ratio s = 1 (old log-prob means set to the current policy's), and the non-finite skip (no parameter and no
Adam state moves, the skip is counted).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from openrlhf_hacpo.actors.update_loop import UpdateLoop
from openrlhf_hacpo.algorithms import LossTotals
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow
from openrlhf_hacpo.utils.weighted import WeightedMeans
from plain_engine import PlainEngine, Tok

PROMPTS = [[1, 5, 7], [2, 9]]
RESPONSES = [[4, 11, 3, 6], [8, 2]]
ADVANTAGE = 0.75


@pytest.fixture
def loop():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    model.train()
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--algorithm", "gspo",
                        "--n_samples_per_prompt", "2", "--rollout_batch_size", "1", "--train_batch_size", "2",
                        "--micro_train_batch_size", "1", "--kernel_backend", "torch", "--temperature", "0.7"])
    optimizer = SkippableAdamW(model.parameters(), lr=1e-2)
    engine = PlainEngine(model, optimizer, gas=2)
    return UpdateLoop(cfg, cfg.resolved_agents[0], 0, 0, 1, engine, optimizer, Tok(), None, torch.device("cpu"))


@torch.no_grad()
def reference(model: torch.nn.Module, temperature: float) -> tuple[list[float], dict[int, torch.Tensor], float]:
    """Float64 forward of each unpadded row at ``temperature``: each row's mean response log-prob, its per-token
    log-probs by row index (a reference policy equal to the current one: KL 0) and the mean entropy over all
    response tokens."""
    model64 = _float64_copy(model)
    means, tokens, entropies = [], {}, []
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
        ids = torch.tensor([prompt + response])
        logits = model64(input_ids=ids).logits[0, len(prompt) - 1: -1] / temperature
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp[torch.arange(len(response)), torch.tensor(response)]
        means.append(float(chosen.mean()))
        tokens[i] = chosen.float()
        entropies += (-(logp.exp() * logp).sum(-1)).tolist()
    return means, tokens, sum(entropies) / len(entropies)


def _float64_copy(model):
    import copy

    return copy.deepcopy(model).double().eval()


def batch(old_means: list[float]) -> LearnerBatch:
    rows = [LearnerRow(prompt_id=f"p{i}", prompt_ids=p, response_ids=r, is_own=True, source=0, reward=1.0,
                       old_logp_mean=m, old_logp=None) for i, (p, r, m) in enumerate(zip(PROMPTS, RESPONSES, old_means))]
    out = LearnerBatch(learner=0, rows=rows)
    out.attach(torch.full((len(rows),), ADVANTAGE, dtype=torch.float64), torch.ones(len(rows), dtype=torch.float64))
    return out


TOTALS = LossTotals(num_seqs=2, num_tokens=6, num_own_seqs=2, num_own_tokens=6)


def test_micro_loss_at_ratio_one_is_minus_the_advantage_and_reports_the_entropy(loop):
    """With s = 1 every own row's objective is min(A, clip(1)·A) = A and the KL to an equal reference is 0; the loss
    is minus their mean, A = 0.75 for both rows. The entropy is the float64 mean over the 6 response tokens of
    H(softmax(z / T))."""
    assert loop.cfg.algo.loss.params.kl_coef > 0  # the reference log-probs reach the loss
    means, ref, entropy = reference(loop.engine.module, loop.cfg.rollout.temperature)
    loss, out = loop.micro_loss(batch(means).packed(0), 0, TOTALS, ref)
    assert out is not None
    assert float(loss.detach()) == pytest.approx(-ADVANTAGE, abs=1e-5)
    assert out.metrics["entropy"] == pytest.approx(entropy, rel=1e-5)


def test_a_nan_loss_gives_a_zero_surrogate_with_zero_gradient(loop):
    loss_fn = loop.loss_fn
    loop.loss_fn = lambda inp, cfg, **kw: dataclasses.replace(loss_fn(inp, cfg, **kw), loss=torch.tensor(float("nan")))
    _, ref, _ = reference(loop.engine.module, loop.cfg.rollout.temperature)
    loss, out = loop.micro_loss(batch([-2.0, -2.0]).packed(0), 0, TOTALS, ref)
    assert out is None and float(loss.detach()) == 0.0
    loss.backward()
    grads = [p.grad for p in loop.engine.module.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads)


def run_update(loop, nan_micro: int | None):
    loss_fn, calls = loop.loss_fn, []

    def maybe_nan(inp, cfg, **kw):
        out = loss_fn(inp, cfg, **kw)
        calls.append(1)
        return dataclasses.replace(out, loss=out.loss * float("nan")) if len(calls) - 1 == nan_micro else out

    loop.loss_fn = maybe_nan
    means, ref, _ = reference(loop.engine.module, loop.cfg.rollout.temperature)
    stats, ratios = WeightedMeans(), []
    before = {n: p.detach().clone() for n, p in loop.engine.module.named_parameters()}
    loop.run_update(batch(means), 0, 1, ref, stats, ratios)
    moved = max(float((p.detach() - before[n]).abs().max()) for n, p in loop.engine.module.named_parameters())
    return moved, stats.state()


def test_one_nan_micro_batch_skips_the_whole_update(loop):
    moved, state = run_update(loop, nan_micro=1)
    assert moved == 0.0
    assert loop.skipped_updates == 1 and loop.updates_done == 0
    assert not loop.client_optimizer.state  # no Adam moment or step counter was created
    assert "loss" not in state and not loop.client_optimizer.skip_next_step


def test_a_finite_update_moves_the_parameters_and_logs_the_summed_loss(loop):
    """Two micro-batches of one row each, each loss −A / 2 (denominator: the mini-batch's 2 rows): loss = −A."""
    moved, state = run_update(loop, nan_micro=None)
    assert moved > 0.0 and loop.updates_done == 1 and loop.skipped_updates == 0
    total, weight = state["loss"]
    assert total / weight == pytest.approx(-ADVANTAGE, abs=1e-5)
    assert state["policy/entropy"][1] == 6.0  # the entropy is averaged over the 6 response tokens


def test_the_loop_has_the_public_steps_the_probe_and_the_two_phase_step_use(loop):
    """:class:`UpdateLoop` implements :class:`~openrlhf_hacpo.actors.update_steps.UpdateSteps`: every attribute,
    and every method with the protocol's parameters."""
    import inspect

    from openrlhf_hacpo.actors.update_steps import UpdateSteps

    assert all(hasattr(loop, name) for name in UpdateSteps.__annotations__)
    methods = {name: f for name, f in vars(UpdateSteps).items() if inspect.isfunction(f) and not name.startswith("_")}
    assert {"prepare", "begin_update", "rows_to_train", "backward", "finish_update", "loss_of"} <= set(methods)
    for name, method in methods.items():
        assert inspect.signature(getattr(UpdateLoop, name)).parameters.keys() == \
            inspect.signature(method).parameters.keys(), name
