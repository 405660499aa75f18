"""Zero-gradient row skipping at the edges of the foreign window: the skipped rows are exactly those without gradient.

Foreign rows sit just inside and just outside every edge where a rule's gradient switches on or off (the stepwise
window's lower end lo_m and upper end hi, the pessimistic mode's dual clip, Naive's own-row clip, the log-ratio clamp
±C alone and where it cuts into the window), at 0.0005 and 0.002 in log-ratio (about as much in s) on either side,
with both signs of A. The probe keeps a row when its gradient is non-zero at ℓ or ℓ ± ``SKIP_MARGIN`` (1e-3), so
rows 0.0005 outside are kept and rows 0.002 outside are skipped; a probe window narrowed by even 0.002 drops a row
that has gradient. All offsets are at least 1e-4 from every edge and every edge ± margin, two orders of magnitude
above the float32 noise of ℓ (about 1e-6).

Two copies of a tiny Llama take the same sequence of updates m = 0..8 (lo_m rises from 0.8 to 1, eq. 14), the rows
re-placed around update m's edges before each, one copy skipping rows and grouping by length, one not. For every
update: the skipping copy trains exactly the rows the float64 reference says it must (own rows and foreign rows with
gradient within the margin), the full copy trains every row, and the accumulated gradient, the parameters after the
step and every logged metric agree to float32 noise. A second test draws row ratios around the edges with
Hypothesis and checks the property directly: every row whose float64 gradient is non-zero went through a backward
pass, and every row whose gradient is zero everywhere within the margin did not.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.hacpo_loss import _hacpo_fwd_kernel
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.actors.zero_grad_probe import SKIP_MARGIN
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted
from skipping_rig import (PROMPTS, RESPONSES, RULES, Row, edges, expected_backward_rows, has_gradient, lower_bound,
                          learner_batch, make_config, make_loop, make_model, mean_logps, zero_gradient_nearby)

TRITON = interpreter_active(_hacpo_fwd_kernel)
OFFSETS = (0.002, 0.0005, -0.0005, -0.002)
"""Where rows sit around an edge, in log-ratio towards the side with gradient (negative: outside)."""
UPDATES = tuple(range(9))
"""m = 0..8: lo_m = 0.8, 0.825, ..., 1 (δ = 0.2, δ_step = 0.025): the window closes at m = 8."""
TRITON_UPDATES = (3,)
"""The Triton interpreter runs one update, lo_3 = 0.875, in micro-batches of 12 rows (each interpreted launch costs
tens of milliseconds); the torch twin runs them all."""
MICRO = {"torch": 6, "triton": 12}
"""Rows per micro-batch: the full copy packs 2-6 micro-batches, the probe groups of 24 or 48 rows."""
ADVANTAGES = (0.9, -0.7)
OWN_ROWS = [Row(0, 0, True, 0.0, 0.8), Row(1, 1, True, 0.0, -0.6)]

# Tolerances. Both copies compute the same sums of float32 terms in other orders and packings (other micro-batch
# compositions, other padding), so log-probs differ by a few ulps. Measured over these tests (torch twin, all
# updates; Triton, update 3): the accumulated gradient differs by at most 4.2e-6 of its largest entry, parameters by
# 1.7e-6, metrics by 1.7e-6 relative. The bounds below are 6-12x that noise and far below what one row changes: a
# row is one of 18-34 rows of the update, a few percent of the gradient, and AdamW moves a parameter by about lr =
# 1e-2 on the steps where its gradient's sign changes.
GRAD_RTOL = 5e-5
PARAM_ATOL = 1e-5
METRIC_REL, METRIC_ABS = 1e-5, 1e-6


def edge_rows(rule: str, loss, m: int) -> list[Row]:
    """Own rows plus, around each of update m's edges, one foreign row per offset and sign of A (token sequences
    cycled so micro-batches mix lengths)."""
    rows = list(OWN_ROWS)
    k = 0
    for ell, inward in edges(rule, loss, m):
        for adv in ADVANTAGES:
            for off in OFFSETS:
                rows.append(Row(k % len(PROMPTS), (k * 5 + 2) % len(RESPONSES), False, ell + inward * off, adv))
                k += 1
    return rows


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def run_update(loop, batch, m: int) -> tuple[dict, UpdateWork]:
    stats, work = WeightedMeans(), UpdateWork()
    loop.run_update(batch, m, 1, {}, stats, [], None, work)
    return merge_weighted([stats.state()]), work


BACKENDS = [pytest.param("torch", UPDATES, id="torch")] + (
    [pytest.param("triton", TRITON_UPDATES, id="triton")] if TRITON else [])


@pytest.mark.parametrize("backend,updates", BACKENDS)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_rows_at_the_window_edges_train_exactly_as_the_full_computation(backend, updates, rule):
    full_model, skip_model = make_model(), make_model()
    full = make_loop(full_model, make_config(backend, False, rule, MICRO[backend]), lr=1e-2)
    skip = make_loop(skip_model, make_config(backend, True, rule, MICRO[backend]), lr=1e-2)
    loss = full.cfg.algo.loss
    skipped_any = False
    for m in updates:
        rows = edge_rows(rule, loss, m)
        batch = learner_batch(rows, mean_logps(full_model, rows))  # placed around update m's edges
        full_stats, full_work = run_update(full, batch, m)
        skip_stats, skip_work = run_update(skip, batch, m)
        where = f"{rule}, update {m}"

        # the result: the full computation's gradient, parameters and metrics
        g_full, g_skip = full.engine.step_grads[-1], skip.engine.step_grads[-1]
        scale = float(g_full.abs().max())
        torch.testing.assert_close(g_skip, g_full, rtol=0.0, atol=GRAD_RTOL * max(scale, 1e-12),
                                   msg=lambda e: f"accumulated gradient, {where}: {e}")
        torch.testing.assert_close(flat_params(skip_model), flat_params(full_model), rtol=0.0, atol=PARAM_ATOL,
                                   msg=lambda e: f"parameters after {where}: {e}")
        assert set(skip_stats) == set(full_stats), where
        for key, value in full_stats.items():
            assert skip_stats[key] == pytest.approx(value, rel=METRIC_REL, abs=METRIC_ABS), (where, key)

        # the work: exactly the rows the reference says, every row in the full copy
        expected = expected_backward_rows(rows, rule, loss, m)
        assert all(i in expected for i, r in enumerate(rows) if has_gradient(r, rule, loss, m)), where
        assert sorted(full_work.rows_backward_index) == list(range(len(rows))), where
        trained = set(skip_work.rows_backward_index)
        assert trained == expected, (where, {i: (rows[i].ell, rows[i].adv) for i in trained ^ expected})
        assert skip_work.rows_backward == len(expected) and skip_work.rows == len(rows), where
        skipped_any |= len(expected) < len(rows)
    assert skipped_any, f"{rule}: no row was ever skipped, the test would not see a wrong skip"


# ------------------------------------------------------------------------------------------------ the property
PROPERTY_RULES = sorted(RULES)
FOREIGN_ROWS = 8


@pytest.fixture(scope="module")
def fixed_policy():
    """One model that never moves (lr = 0) and its float64 mean log-probs, shared by every drawn example."""
    model = make_model(seed=1)
    return model, mean_logps(model)


def drawn_rows(draw, rule: str, loss, m: int) -> list[Row]:
    """Own rows plus foreign rows at a drawn edge of update m, offset by up to ±4·SKIP_MARGIN, with a drawn A
    (0 included: a row with A = 0 has no gradient anywhere)."""
    sites = edges(rule, loss, m)
    rows = list(OWN_ROWS)
    for k in range(FOREIGN_ROWS):
        ell, _ = sites[draw(st.integers(0, len(sites) - 1))]
        off = draw(st.floats(-4 * SKIP_MARGIN, 4 * SKIP_MARGIN, allow_nan=False))
        adv = draw(st.sampled_from((1.3, 0.5, 0.0, -0.4, -1.1)))
        rows.append(Row(k % len(PROMPTS), (k * 5 + 1) % len(RESPONSES), False, ell + off, adv))
    return rows


@pytest.mark.parametrize("rule", PROPERTY_RULES)
def test_every_row_with_gradient_goes_through_the_backward_pass(rule, fixed_policy):
    model, means = fixed_policy
    loop = make_loop(model, make_config("torch", True, rule, MICRO["torch"]), lr=0.0)
    loss = loop.cfg.algo.loss

    # no shrinking: each example is a whole update; the message names the rows at fault
    @settings(max_examples=12, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data(), m=st.sampled_from(UPDATES))
    def check(data, m):
        rows = drawn_rows(data.draw, rule, loss, m)
        _, work = run_update(loop, learner_batch(rows, means), m)
        trained = set(work.rows_backward_index)
        # Once lo_m has risen to hi the window is the single point s = 1, where the clamp passes gradient only if
        # the update's float32 ratio is exactly 1.0: a row drawn onto that point is decided by float noise, in the
        # probe and in the full update alike (the parameters' equality is checked by the edge tests), so it is left
        # out of both directions here.
        collapsed = lower_bound(loss, m) >= loss.params.cross_clip_high and rule in ("clamp", "log_clamp")
        rows_checked = [i for i, r in enumerate(rows) if not (collapsed and not r.own and abs(r.ell) < 1e-6)]
        with_grad = {i for i in rows_checked if has_gradient(rows[i], rule, loss, m)}
        left_out = {i: (rows[i].ell, rows[i].adv) for i in with_grad - trained}
        assert not left_out, f"update {m}: rows (ℓ, A) with gradient left out of the backward pass: {left_out}"
        # just past the margin (+1e-4, ≫ float noise) a row without gradient nearby must be skipped
        idle = {i for i in rows_checked if zero_gradient_nearby(rows[i], rule, loss, m, SKIP_MARGIN + 1e-4)}
        extra = {i: (rows[i].ell, rows[i].adv) for i in idle & trained}
        assert not extra, f"update {m}: rows (ℓ, A) without gradient near ℓ went through a backward: {extra}"

    check()
