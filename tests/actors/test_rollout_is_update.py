"""The training-inference correction (``--rollout_is``) in a learner's update, below the agent group: learner rows that
carry the engines' log-probs reach the loss, the zero-gradient probe sees the corrected loss (a masked foreign row is
skipped, a kept one is not, and skipping stays exact), and ``--old_logp_from_update`` weighs with the old log-probs
its first update fills in.

Rows are placed at chosen sequence log-ratios as in skipping_rig.py; the engine's mean log-prob of each row is set
relative to its old one, so each row's correction weight w = exp(old_mean − engine_mean) is known by hand.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.hacpo_loss import _hacpo_fwd_kernel
from openrlhf_hacpo.actors import first_update
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted
from skipping_rig import Row, learner_batch, make_config, make_loop, make_model, mean_logps, objective64
from test_first_update import ROWS as FIRST_ROWS, token_logps64

BACKENDS = ["torch"] + (["triton"] if interpreter_active(_hacpo_fwd_kernel) else [])
MASK = ("--rollout_backend", "hf_engine", "--rollout_is", "--rollout_is_mode", "mask", "--rollout_is_threshold", "1.5")
"""Mask mode, window [1/1.5, 1.5] = [0.667, 1.5]."""

# (prompt, response, own?, ratio s, advantage, log w = old_mean − engine_mean): every foreign row inside HACPO's
# window [0.8, 1] (so each has gradient without the correction); rows 3 and 6 (foreign) and 1 (own) are masked
ROWS = [(0, 0, True, 1.0, 0.8, 0.0), (1, 1, True, 1.0, -0.6, 0.7), (2, 2, False, 0.9, 1.2, 0.2),
        (3, 3, False, 0.85, 0.9, 1.0), (0, 4, False, 0.95, -0.7, -0.3), (1, 5, False, 0.93, -1.1, 0.0),
        (2, 3, False, 0.88, 0.4, -0.6), (3, 2, False, 0.97, -0.5, 0.35)]
MASKED = {1, 3, 6}


def corrected_batch(model, rows=ROWS):
    batch = learner_batch([Row(p, r, own, math.log(s), a) for p, r, own, s, a, _ in rows], mean_logps(model))
    for row, spec in zip(batch.rows, rows):
        row.engine_logp_mean = row.old_logp_mean - spec[5]
    return batch


def run_update(backend, skip, extra=MASK, lr=5e-2):
    model = make_model()
    loop = make_loop(model, make_config(backend, skip, "clamp", micro=3, extra=extra), lr=lr)
    batch = corrected_batch(model)
    stats, work = WeightedMeans(), UpdateWork()
    loop.run_update(batch, 0, 1, {}, stats, [], None, work)
    params = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    return loop, batch, merge_weighted([stats.state()]), params, work


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_foreign_rows_are_skipped_and_skipping_stays_exact(backend):
    _, _, full_stats, full_params, full_work = run_update(backend, skip=False)
    _, _, skip_stats, skip_params, skip_work = run_update(backend, skip=True)
    # every row reaches the full computation's backward; the skipping path leaves out exactly the masked foreign rows
    assert full_work.rows_backward == len(ROWS)
    assert skip_work.rows_backward == len(ROWS) - len(MASKED - {1})
    torch.testing.assert_close(skip_params, full_params, rtol=1e-4, atol=1e-5)
    assert set(full_stats) == set(skip_stats)
    for key, value in full_stats.items():
        assert skip_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # the probe itself, before any update: the foreign rows it keeps are the unmasked ones
    model = make_model()
    loop = make_loop(model, make_config(backend, True, "clamp", micro=3, extra=MASK), lr=0.0)
    update = loop.begin_update(corrected_batch(model), 0, {}, WeightedMeans(), [])
    foreign = [i for i, row in enumerate(ROWS) if not row[2]]
    assert loop.rows_to_train(update, foreign) == [i for i in range(len(ROWS)) if i not in MASKED - {1}]
    # without the correction the same rows all train: the skips above are the correction's
    _, _, _, plain_params, plain_work = run_update(backend, skip=True, extra=("--rollout_backend", "hf_engine"))
    assert plain_work.rows_backward == len(ROWS)
    assert not torch.allclose(plain_params, full_params, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_update_loss_is_the_corrected_objective_by_hand(backend):
    """lr = 0: the update's logged loss is −(1/N) Σ_i ρ_i obj_i over all N rows (masked ones count in N), obj from the
    paper's formulas (skipping_rig.objective64), ρ_i = w_i inside [1/1.5, 1.5], else 0; its metrics count the
    masked rows."""
    loop, batch, stats, _, _ = run_update(backend, skip=True, lr=0.0)
    cfg = loop.cfg.algo.loss
    total = 0.0
    for i, (_, _, own, s, adv, log_w) in enumerate(ROWS):
        w = math.exp(log_w)
        rho = w if 1 / 1.5 <= w <= 1.5 else 0.0
        total += rho * float(objective64(torch.tensor(math.log(s), dtype=torch.float64), adv, own, "clamp", cfg, 0))
    assert stats["loss"] == pytest.approx(-total / len(ROWS), rel=1e-5)
    assert stats["policy/rollout_is_foreign_masked_frac"] == pytest.approx(2 / 6)
    assert stats["policy/rollout_is_own_masked_frac"] == pytest.approx(1 / 2)
    kept = [math.exp(r[5]) for r in ROWS if not r[2] and math.exp(r[5]) <= 1.5 and math.exp(r[5]) >= 1 / 1.5]
    assert stats["policy/rollout_is_foreign_weight_mean"] == pytest.approx(sum(kept) / 6, rel=1e-5)


def test_a_batch_without_engine_log_probs_is_refused():
    model = make_model()
    loop = make_loop(model, make_config("torch", True, "clamp", extra=MASK), lr=0.0)
    batch = corrected_batch(model)
    batch.rows[4].engine_logp_mean = math.nan
    with pytest.raises(ValueError, match=r"agent 'a': --rollout_is needs the sampling engines' log-probs of every "
                                         r"row, 1 of 8 rows carry none \(e\.g\. 'q4' from agent 1\)"):
        loop.check_batch(batch)


# ------------------------------------------------------------------------------------------------ old_logp_from_update
TOKEN_MASK = ("--rollout_backend", "hf_engine", "--rollout_is", "--rollout_is_level", "token", "--rollout_is_mode",
              "mask", "--rollout_is_threshold", "1.5")


def run_first_update(backend: str, saving: bool):
    """test_first_update.py's step (3 updates, own rows 0, 1, 8) with a per-token masking correction: the own rows'
    engine log-probs are their float64 old log-probs moved per token (token 0 of row 0 by −1: w = e, masked), the
    foreign rows' engine means their old means moved by a row's gap (row 3: −1, masked)."""
    model = make_model()
    extra = ("--train_batch_size", "4") + TOKEN_MASK + (("--old_logp_from_update",) if saving else ())
    loop = make_loop(model, make_config(backend, True, "clamp", micro=2, extra=extra), lr=5e-2)
    rows = [Row(p, r, own, math.log(s), a) for p, r, own, s, a in FIRST_ROWS]
    batch = learner_batch(rows, mean_logps(model))
    for i, (row, spec) in enumerate(zip(batch.rows, FIRST_ROWS)):
        if row.is_own:
            old = torch.tensor(token_logps64(model, spec[0], spec[1]), dtype=torch.float64)
            gaps = torch.full_like(old, 0.1 * (i % 3 - 1))
            if i == 0:
                gaps[0] = 1.0
            row.engine_logp = (old - gaps).float()
            row.engine_logp_mean = float((old - gaps).mean())
            row.old_logp = None if saving else old.float()  # the full computation's scoring pass, per token
        else:
            row.engine_logp_mean = row.old_logp_mean - (1.0 if i == 3 else 0.15 * (i % 3 - 1))
    trajectories = [SimpleNamespace(source=0 if row.own else 1) for row in rows]
    loop.learner_batch = lambda trajs: batch
    loop.attach_advantages = lambda view, ratios: view.advantages.float()
    if not saving:
        return loop, loop.train_step(trajectories, step=1, ratios=None)
    old_means = [r.old_logp_mean for r in batch.rows]
    for r in batch.rows:
        if r.is_own:
            r.old_logp_mean = math.nan
    phase = first_update.own_rows_first(loop, trajectories, 1, None)
    for p, values in phase.old_logps.items():
        old_means[p] = math.fsum(values.tolist()) / len(values)
    return loop, first_update.finish_step(loop, phase, old_means)


@pytest.mark.parametrize("backend", BACKENDS)
def test_old_logp_from_update_weighs_with_the_old_log_probs_it_fills_in(backend):
    full, full_result = run_first_update(backend, saving=False)
    saving, saving_result = run_first_update(backend, saving=True)
    grads_full, grads_saving = full.engine.step_grads, saving.engine.step_grads
    assert len(grads_full) == len(grads_saving) == 3
    for m, (a, b) in enumerate(zip(grads_full, grads_saving)):
        assert bool(torch.isfinite(b).all()), m
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=lambda e: f"gradient of update {m}: {e}")
    a, b = merge_weighted([full_result.metrics]), merge_weighted([saving_result.metrics])
    for key in [k for k in a if k.startswith("policy/rollout_is_")]:
        assert math.isfinite(b[key]) and b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    # one masked own token among the own rows' tokens, one masked foreign row of 9
    own_tokens = sum(len(r.response_ids) for r in saving.learner_batch(None).rows if r.is_own)
    assert b["policy/rollout_is_own_masked_frac"] == pytest.approx(1 / own_tokens, rel=1e-6)
    assert b["policy/rollout_is_foreign_masked_frac"] == pytest.approx(1 / 9, rel=1e-6)
