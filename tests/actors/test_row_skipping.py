"""Rows with zero gradient leave the backward pass, and the result is the full computation's.

Two copies of a tiny Llama take the same updates on the same learner rows (own rows and foreign rows whose sequence
ratios sit inside and outside the foreign window), one with ``skip_zero_grad_rows`` and length-grouped micro-batches,
one without. After every update the parameters, the logged loss and every loss metric must agree (float32 noise
only), while the skipping copy ran fewer rows through the backward pass. Both kernel backends; the foreign rules that
keep gradient outside the window (``pessimistic``, no clip, Naive) must keep those rows. The rows at the window's
edges are in test_row_skipping_edges.py.

The step's records count skipped rows as trained: a whole ``train_step`` on rows whose skipping is known by hand
logs the foreign-ratio median over every foreign row, the rows and tokens trained and those that reached a backward
pass, the probe's padding and the window fractions, each equal to its value worked out from the rows.
"""
from __future__ import annotations

import math

import pytest
import torch

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.hacpo_loss import _hacpo_fwd_kernel
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted
from skipping_rig import PROMPTS, RESPONSES, Row, learner_batch, make_config, make_loop, make_model, mean_logps, \
    objective64

# (prompt, response, own?, target ratio s at the start, advantage): foreign rows well inside [0.8, 1], below it
# (s = 0.5, 0.6) and above it (s = 1.3, 1.5), with both signs of A
ROWS = [(0, 0, True, 1.0, 0.8), (1, 1, True, 1.0, -0.6), (2, 2, False, 0.9, 1.2), (3, 3, False, 0.5, 0.9),
        (0, 4, False, 1.3, -0.7), (1, 5, False, 0.6, -1.1), (2, 3, False, 1.5, 0.4), (3, 2, False, 0.93, -0.5),
        (0, 1, True, 1.0, 0.3), (1, 0, False, 0.55, 1.0), (2, 5, False, 1.4, 1.3), (3, 4, False, 0.97, 0.6)]
BACKENDS = ["torch"] + (["triton"] if interpreter_active(_hacpo_fwd_kernel) else [])


def run_updates(backend: str, skip: bool, rule: str, updates: int = 3):
    model = make_model()
    loop = make_loop(model, make_config(backend, skip, rule), lr=5e-2)
    batch = learner_batch([Row(p, r, own, math.log(s), a) for p, r, own, s, a in ROWS], mean_logps(model))
    states, params, backward_rows = [], [], []
    for m in range(updates):
        stats, work = WeightedMeans(), UpdateWork()
        loop.run_update(batch, m, 1, {}, stats, [], None, work)
        states.append(merge_weighted([stats.state()]))
        params.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))
        backward_rows.append(work.rows_backward)
    return states, params, backward_rows


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", ["clamp", "pessimistic", "no_clip", "naive"])
def test_skipping_rows_changes_nothing_but_the_work(backend, rule):
    full_states, full_params, full_rows = run_updates(backend, False, rule)
    skip_states, skip_params, skip_rows = run_updates(backend, True, rule)
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


# ------------------------------------------------------------------------------------------------ the records
# (prompt, response, own?, ratio s, advantage). Two updates on the same 12 rows (max_epochs = 2) with lr = 0, so s
# stays put while the window rises from lo_0 = 0.8 to lo_1 = 0.825 (hi = 1). Foreign rows with gradient: m = 0:
# s = 0.81, 0.9, 0.95; m = 1: s = 0.9, 0.95 (0.81 falls below lo_1). The row at s = 0.92 has A = 0: inside the
# window, but no gradient, so it is skipped at both updates.
STEP_ROWS = [(0, 0, True, 1.0, 0.8), (1, 1, True, 1.0, -0.6), (2, 2, True, 1.0, 0.3),
             (3, 3, False, 0.5, 0.9), (0, 4, False, 0.6, -1.1), (1, 5, False, 0.7, 0.5), (2, 3, False, 0.75, -0.4),
             (3, 2, False, 0.81, 1.2), (0, 1, False, 0.9, -0.5), (1, 0, False, 0.92, 0.0), (2, 5, False, 0.95, 0.6),
             (3, 4, False, 1.3, 0.4)]
TRAINED_FOREIGN = [{7, 8, 10}, {8, 10}]  # indices into STEP_ROWS of the foreign rows with gradient at m = 0, 1


def test_a_step_counts_skipped_rows_in_its_records():
    model = make_model()
    loop = make_loop(model, make_config("torch", True, "clamp", extra=("--max_epochs", "2")), lr=0.0)
    rows = [Row(p, r, own, math.log(s), a) for p, r, own, s, a in STEP_ROWS]
    batch = learner_batch(rows, mean_logps(model))
    # the step's view and advantages are these rows (building them from trajectories is tested elsewhere)
    loop.learner_batch = lambda trajectories: batch
    loop.attach_advantages = lambda view, ratios: view.advantages.float()
    metrics = merge_weighted([loop.train_step([], step=1, ratios=None).metrics])

    own = [i for i, row in enumerate(STEP_ROWS) if row[2]]
    foreign = [i for i, row in enumerate(STEP_ROWS) if not row[2]]
    length = [len(RESPONSES[row[1]]) for row in STEP_ROWS]
    # every row counts as trained at both updates; only own rows and rows with gradient reach a backward pass
    assert metrics["perf/rows_trained"] == 2 * 12
    assert metrics["perf/tokens_trained"] == 2 * sum(length) == 2 * 36
    assert metrics["perf/rows_backward"] == (3 + 3) + (3 + 2)
    assert metrics["perf/tokens_backward"] == sum(sum(length[i] for i in own + sorted(t)) for t in TRAINED_FOREIGN)
    # the probe packs the 9 foreign rows as the update does, 3 rows per forward grouped by (response, prompt)
    # length: (r, p) = (1, 2) (1, 3) (2, 3) | (3, 2) (3, 2) (3, 4) | (4, 2) (5, 2) (5, 4), so 3 × (3 + 2) + 3 × (4 + 3)
    # + 3 × (4 + 5) = 63 positions at each update, Σ (prompt + response) = 24 + 27 = 51 of them real
    prompt, response = [len(PROMPTS[STEP_ROWS[i][0]]) for i in foreign], [length[i] for i in foreign]
    assert (sum(prompt), sum(response)) == (24, 27)
    assert metrics["perf/pad_frac_probe"] == pytest.approx(1.0 - 51 / 63)
    # the median of s over the foreign rows of both updates, skipped ones included: 18 values, torch's (lower)
    # median is the 9th smallest, s = 0.81 (the rows that reached a backward alone would give 0.9)
    assert metrics["policy/foreign_ratio_median"] == pytest.approx(0.81, rel=1e-5)
    # window fractions over the 9 foreign rows of each update: below lo (4 at m = 0, 5 at m = 1), above hi (1, 1)
    assert metrics["policy/foreign_clip_frac_lower"] == pytest.approx(9 / 18)
    assert metrics["policy/foreign_clip_frac_upper"] == pytest.approx(2 / 18)
    assert metrics["policy/foreign_in_window_frac"] == pytest.approx(7 / 18)
    ratios = [STEP_ROWS[i][3] for i in foreign]
    assert metrics["policy/foreign_ratio_mean"] == pytest.approx(sum(ratios) / 9, rel=1e-5)
    # the logged loss: the mean over the 2 updates of −(1/12) Σ_i obj_i, from the float64 reference objective
    loss = loop.cfg.algo.loss
    per_update = [-sum(float(objective64(torch.tensor(r.ell, dtype=torch.float64), r.adv, r.own, "clamp", loss, m))
                       for r in rows) / 12 for m in (0, 1)]
    assert metrics["loss"] == pytest.approx(sum(per_update) / 2, rel=1e-5)
