"""Rows with zero gradient leave the backward pass, and the result is the full computation's.

Two copies of a tiny Llama take the same updates on the same learner rows (own rows and foreign rows whose sequence
ratios sit inside and outside the foreign window), one with ``skip_zero_grad_rows`` and length-grouped micro-batches,
one without. After every update the parameters, the logged loss and every loss metric must agree (float32 noise
only), while the skipping copy ran fewer rows through the backward pass. Both kernel backends; the foreign rules that
keep gradient outside the window (``pessimistic``, no clip, Naive) must keep those rows.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.hacpo_loss import _hacpo_fwd_kernel
from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from openrlhf_hacpo.actors.update_loop import UpdateLoop, _Work
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted
from plain_engine import PlainEngine, Tok

PROMPTS = [[1, 5, 7], [2, 9], [3, 4, 6, 8], [10, 1]]
RESPONSES = [[4, 11, 3, 6], [8, 2], [5, 5, 9], [12, 13, 2, 7, 1], [6], [9, 9, 14]]
# (prompt, response, own?, target ratio s at the start, advantage): foreign rows well inside [0.8, 1], below it
# (s = 0.5, 0.6) and above it (s = 1.3, 1.5), with both signs of A
ROWS = [(0, 0, True, 1.0, 0.8), (1, 1, True, 1.0, -0.6), (2, 2, False, 0.9, 1.2), (3, 3, False, 0.5, 0.9),
        (0, 4, False, 1.3, -0.7), (1, 5, False, 0.6, -1.1), (2, 3, False, 1.5, 0.4), (3, 2, False, 0.93, -0.5),
        (0, 1, True, 1.0, 0.3), (1, 0, False, 0.55, 1.0), (2, 5, False, 1.4, 1.3), (3, 4, False, 0.97, 0.6)]
BACKENDS = ["torch"] + (["triton"] if interpreter_active(_hacpo_fwd_kernel) else [])


def make_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))


@torch.no_grad()
def mean_logps(model: torch.nn.Module) -> list[float]:
    """Float64 mean response log-prob of each row under ``model``, one unpadded forward per row."""
    model64 = copy.deepcopy(model).double().eval()
    out = []
    for p, r, *_ in ROWS:
        prompt, response = PROMPTS[p], RESPONSES[r]
        logits = model64(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1]
        logp = torch.log_softmax(logits, dim=-1)[torch.arange(len(response)), torch.tensor(response)]
        out.append(float(logp.mean()))
    return out


def learner_batch(model: torch.nn.Module) -> LearnerBatch:
    """The rows, each foreign row's old log-prob mean set so its ratio starts at the target s."""
    means = mean_logps(model)
    rows = [LearnerRow(prompt_id=f"q{i}", prompt_ids=PROMPTS[p], response_ids=RESPONSES[r], is_own=own,
                       source=0 if own else 1, reward=1.0, old_logp_mean=m - math.log(s), old_logp=None)
            for i, ((p, r, own, s, _a), m) in enumerate(zip(ROWS, means))]
    batch = LearnerBatch(learner=0, rows=rows)
    batch.attach(torch.tensor([a for *_, a in ROWS], dtype=torch.float64),
                 torch.tensor([1.0 if own else 0.7 for _p, _r, own, *_ in ROWS], dtype=torch.float64))
    return batch


def make_loop(model: torch.nn.Module, backend: str, skip: bool, extra: list[str]) -> UpdateLoop:
    flags = ["--agent", "name=a,pretrain=/m", "--agent", "name=b,pretrain=/m", "--prompt_data", "x.jsonl",
             "--n_samples_per_prompt", "2", "--rollout_batch_size", "3", "--train_batch_size", "12",
             "--micro_train_batch_size", "3", "--kernel_backend", backend, "--init_kl_coef", "0", *extra]
    if not skip:
        flags += ["--no_skip_zero_grad_rows", "--no_length_grouping"]
    cfg = build_config(flags)
    optimizer = SkippableAdamW(model.parameters(), lr=5e-2)
    return UpdateLoop(cfg, cfg.resolved_agents()[0], 0, 0, 1, PlainEngine(model, optimizer, gas=4), optimizer,
                      Tok(), None, torch.device("cpu"))


def run_updates(backend: str, skip: bool, extra: list[str], updates: int = 3):
    model = make_model()
    loop = make_loop(model, backend, skip, extra)
    batch = learner_batch(model)
    states, params, backward_rows = [], [], []
    for m in range(updates):
        stats, work = WeightedMeans(), _Work()
        loop._update(batch, m, 1, {}, stats, [], None, work)
        states.append(merge_weighted([stats.state()]))
        params.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))
        backward_rows.append(work.rows_backward)
    return states, params, backward_rows


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["clamp", "pessimistic", "no_clip", "naive"])
def test_skipping_rows_changes_nothing_but_the_work(backend, rule):
    extra = {"clamp": [], "pessimistic": ["--cross_clip_mode", "pessimistic"], "no_clip": ["--no_cross_clip"],
             "naive": ["--algorithm", "naive"]}[rule]
    full_states, full_params, full_rows = run_updates(backend, False, extra)
    skip_states, skip_params, skip_rows = run_updates(backend, True, extra)
    for m, (a, b) in enumerate(zip(full_params, skip_params)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda e: f"parameters after update {m}: {e}")
    for m, (a, b) in enumerate(zip(full_states, skip_states)):
        assert set(a) == set(b), m
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (m, key)
    assert full_rows == [len(ROWS)] * 3
    if rule == "no_clip":
        assert skip_rows == full_rows  # without the clamp every foreign row has gradient
    else:
        # the 3 own rows always train; at the start 6 of the 9 foreign rows have zero gradient under the clamp, 3 under
        # the pessimistic rule, 4 under Naive's own-row clip
        assert all(len(ROWS) > n >= 3 for n in skip_rows), skip_rows
