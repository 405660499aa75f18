"""Property tests (hypothesis) of the HACPO math on random float64 batches."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacpo_reference import reference_advantages
from openrlhf_hacpo.algorithms import (
    AdvantageConfig,
    LossTotals,
    PolicyLossConfig,
    PolicyLossInput,
    compute_advantages,
    get_policy_loss,
)

SETTINGS = settings(max_examples=40, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def random_batch(seed, rows, width, own_fraction=0.5, with_ref=False, log_s_scale=0.3, update_index=0):
    """Random learner micro-batch: masks with >= 1 token, sequence log-ratios spread around 0."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    logp = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3
    mean = (logp * mask).sum(1) / lengths
    log_s = torch.randn(rows, generator=gen, dtype=torch.float64) * log_s_scale
    is_own = torch.rand(rows, generator=gen) < own_fraction
    fields = dict(
        logp=logp,
        mask=mask,
        advantages=torch.randn(rows, generator=gen, dtype=torch.float64),
        old_logp_mean=mean - log_s,
        is_own=is_own,
        coef=torch.where(is_own, torch.ones(rows, dtype=torch.float64),
                         0.1 + 3 * torch.rand(rows, generator=gen, dtype=torch.float64)),
        update_index=update_index,
    )
    if with_ref:
        fields["ref_logp"] = logp + 0.3 * torch.randn(rows, width, generator=gen, dtype=torch.float64)
    return fields


def run(name, fields, config, **extra):
    fields = dict(fields, **extra)
    logp = fields["logp"].clone().requires_grad_(True)
    fields["logp"] = logp
    out = get_policy_loss(name)(PolicyLossInput(**fields), config)
    out.loss.backward()
    return out, logp.grad


loss_configs = st.builds(
    PolicyLossConfig.of,
    alpha=st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    delta=st.sampled_from([0.1, 0.2, 0.3]),
    delta_step=st.sampled_from([0.0, 0.01, 0.025]),
    kl_coef=st.sampled_from([0.0, 0.001, 0.1]),
    log_ratio_clip=st.sampled_from([None, 0.05, 10.0]),
    loss_agg=st.sampled_from(["seq-mean-token-mean", "token-mean"]),
)


@SETTINGS
@given(seed=seeds, rows=st.integers(1, 6), width=st.integers(1, 5), config=loss_configs, m=st.integers(0, 5))
def test_one_agent_hacpo_equals_gspo(seed, rows, width, config, m):
    fields = random_batch(seed, rows, width, own_fraction=1.1, with_ref=True, update_index=m)
    gspo, gspo_grad = run("gspo", fields, config)
    for name in ("hacpo", "naive"):
        other, grad = run(name, fields, config)
        assert torch.equal(other.loss, gspo.loss)
        assert torch.equal(other.objectives, gspo.objectives)
        assert torch.equal(grad, gspo_grad)


@st.composite
def window_setup(draw):
    m = draw(st.integers(0, 12))
    delta = draw(st.floats(0.01, 0.5))
    delta_step = draw(st.floats(0.0, 0.08))
    alpha = draw(st.floats(0.0, 4.0))
    return m, delta, delta_step, alpha


@SETTINGS
@given(seed=seeds, setup=window_setup(), stepwise=st.booleans())
def test_lower_bound_schedule(seed, setup, stepwise):
    m, delta, delta_step, alpha = setup
    config = PolicyLossConfig.of(delta=delta, delta_step=delta_step, alpha=alpha, stepwise=stepwise, kl_coef=0.0)
    expected = min(1.0, 1.0 - delta + m * delta_step) if stepwise else 1.0 - delta
    assert config.cross_lower_bound(m) == expected
    # behaviour at the bound: just below it a foreign row gets no gradient, just above it (inside) it does
    fields = random_batch(seed, 2, 3, own_fraction=-1.0, update_index=m)
    mean = (fields["logp"] * fields["mask"]).sum(1) / fields["mask"].sum(1)
    above = expected + (1.0 - expected) / 2 if expected < 1.0 else 1.0
    s = torch.tensor([expected * (1 - 1e-6), above], dtype=torch.float64)
    fields["old_logp_mean"] = mean - torch.log(s)
    fields["advantages"] = torch.tensor([0.7, -0.9], dtype=torch.float64)
    out, grad = run("hacpo", fields, config)
    assert torch.all(grad[0] == 0)
    assert torch.all(grad[1][fields["mask"][1]] != 0)
    assert out.metrics["cross_lower_bound"] == expected


@SETTINGS
@given(seed=seeds, setup=window_setup(), side=st.sampled_from(["below", "above"]), gap=st.floats(1e-6, 2.0))
def test_foreign_ratio_outside_window_has_zero_gradient(seed, setup, side, gap):
    m, delta, delta_step, alpha = setup
    config = PolicyLossConfig.of(delta=delta, delta_step=delta_step, alpha=alpha, kl_coef=0.0)
    lo = config.cross_lower_bound(m)
    fields = random_batch(seed, 4, 4, update_index=m)
    fields["is_own"][0] = False
    fields["coef"][0] = 1.7
    mean = (fields["logp"][0] * fields["mask"][0]).sum() / fields["mask"][0].sum()
    s = lo * math.exp(-gap) if side == "below" else math.exp(gap)
    fields["old_logp_mean"][0] = mean - math.log(s)
    out, grad = run("hacpo", fields, config)
    assert torch.all(grad[0] == 0)  # exactly zero, whatever the sign of A
    c = min(max(s, lo), 1.0)
    expected = c ** (1 + alpha) * 1.7 * fields["advantages"][0].item()
    assert math.isclose(out.objectives[0].item(), expected, rel_tol=1e-10, abs_tol=1e-300)


@SETTINGS
@given(seed=seeds, setup=window_setup(), u=st.floats(1e-6, 1.0 - 1e-6), rows=st.integers(1, 5), width=st.integers(1, 6))
def test_foreign_gradient_matches_prop_d6(seed, setup, u, rows, width):
    m, delta, delta_step, alpha = setup
    config = PolicyLossConfig.of(delta=delta, delta_step=delta_step, alpha=alpha, kl_coef=0.0)
    lo = config.cross_lower_bound(m)
    fields = random_batch(seed, rows, width, own_fraction=-1.0, update_index=m)  # all foreign
    mask = fields["mask"]
    lengths = mask.sum(1).to(torch.float64)
    mean = (fields["logp"] * mask).sum(1) / lengths
    s = lo + u * (1.0 - lo)  # strictly inside [lo, 1] (s = 1 exactly when lo = 1)
    fields["old_logp_mean"] = mean - math.log(s)
    out, grad = run("hacpo", fields, config)
    # Prop. D.6: ∇ obj = sg(c)^(α+1) · ω · A · (1/|y|) Σ_t ∇ log π_t, and loss = −Σ obj / B
    per_row = -(s ** (alpha + 1)) * fields["coef"] * fields["advantages"] / lengths / rows
    expected = per_row[:, None] * mask
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-15)


@SETTINGS
@given(seed=seeds, rows=st.integers(2, 8), width=st.integers(1, 5), config=loss_configs, m=st.integers(0, 5),
       name=st.sampled_from(["hacpo", "naive"]))
def test_loss_is_permutation_invariant(seed, rows, width, config, m, name):
    fields = random_batch(seed, rows, width, with_ref=True, update_index=m)
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(seed + 1))
    permuted = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    out, grad = run(name, fields, config)
    out_p, grad_p = run(name, permuted, config)
    torch.testing.assert_close(out_p.loss, out.loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out_p.objectives, out.objectives[perm], rtol=0, atol=0)
    torch.testing.assert_close(grad_p, grad[perm], rtol=1e-12, atol=1e-15)


@SETTINGS
@given(seed=seeds, rows=st.integers(2, 10), width=st.integers(1, 5), config=loss_configs, m=st.integers(0, 5),
       chunks=st.integers(2, 4), name=st.sampled_from(["hacpo", "naive"]))
def test_micro_batch_sum_equals_full_batch(seed, rows, width, config, m, chunks, name):
    fields = random_batch(seed, rows, width, with_ref=True, update_index=m)
    full, full_grad = run(name, fields, config)
    mask, own = fields["mask"], fields["is_own"]
    totals = dict(num_seqs=rows, num_tokens=int(mask.sum()), num_own_seqs=int(own.sum()),
                  num_own_tokens=int(mask[own].sum()))
    total_loss = torch.zeros((), dtype=torch.float64)
    grads = []
    for part in torch.arange(rows).tensor_split(chunks):
        if part.numel() == 0:
            continue
        piece = {k: (v[part] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
        out, grad = run(name, piece, config, totals=LossTotals(**totals))
        total_loss = total_loss + out.loss.detach()
        grads.append(grad)
    torch.testing.assert_close(total_loss, full.loss.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat(grads), full_grad, rtol=1e-12, atol=1e-15)


@st.composite
def advantage_problem(draw):
    n = draw(st.integers(1, 4))
    prompts = draw(st.integers(1, 4))
    group = draw(st.integers(1, 4))
    learner = draw(st.integers(0, n - 1))
    binary = draw(st.booleans())
    seed = draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    rows = [(p, j) for p in range(prompts) for j in range(n) for _ in range(group)]
    order = torch.randperm(len(rows), generator=gen).tolist()
    rows = [rows[i] for i in order]
    if binary:
        rewards = (torch.rand(len(rows), generator=gen) < 0.5).to(torch.float64)
    else:
        rewards = torch.rand(len(rows), generator=gen, dtype=torch.float64)
    omega = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64)).clamp(0.1, 10)
    omega[learner] = 1.0
    ids = torch.tensor([10 * p + 3 for p, _ in rows])  # non-contiguous ids
    return rewards, ids, torch.tensor([j for _, j in rows]), learner, omega


@SETTINGS
@given(problem=advantage_problem(), weighting=st.booleans(), scope=st.sampled_from(["joint", "own"]),
       normalize=st.booleans(), uniform_guard=st.booleans(), baseline_guard=st.booleans())
def test_advantages_match_reference(problem, weighting, scope, normalize, uniform_guard, baseline_guard):
    rewards, ids, sources, learner, omega = problem
    cfg = AdvantageConfig(capability_weighting=weighting, scope=scope, std_normalize=normalize,
                          uniform_reward_guard=uniform_guard, baseline_guard=baseline_guard,
                          require_equal_group_sizes=True)
    out = compute_advantages(rewards, ids, sources, learner, omega, cfg)
    adv, base, std = reference_advantages(rewards.tolist(), ids.tolist(), sources.tolist(), learner,
                                          omega.tolist(), weighting=weighting, scope=scope,
                                          std_normalize=normalize, uniform_guard=uniform_guard,
                                          baseline_guard=baseline_guard)
    torch.testing.assert_close(out.baselines, torch.tensor(base, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.stds, torch.tensor(std, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # unguarded uniform groups divide ~1e-16 by eps; compare relative there
    torch.testing.assert_close(out.advantages, torch.tensor(adv, dtype=torch.float64), rtol=1e-8, atol=1e-9)


@SETTINGS
@given(problem=advantage_problem(), values=st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=4, max_size=4))
def test_uniform_rewards_give_zero_advantages(problem, values):
    _, ids, sources, learner, omega = problem
    rewards = torch.tensor([values[(int(i) - 3) // 10] for i in ids], dtype=torch.float64)
    out = compute_advantages(rewards, ids, sources, learner, omega)
    assert torch.equal(out.advantages, torch.zeros_like(rewards))
    assert torch.equal(out.baselines, rewards)


@SETTINGS
@given(problem=advantage_problem(), scope=st.sampled_from(["joint", "own"]))
def test_advantages_are_permutation_equivariant(problem, scope):
    rewards, ids, sources, learner, omega = problem
    perm = torch.randperm(rewards.numel(), generator=torch.Generator().manual_seed(int(rewards.numel())))
    cfg = AdvantageConfig(scope=scope)
    out = compute_advantages(rewards, ids, sources, learner, omega, cfg)
    out_p = compute_advantages(rewards[perm], ids[perm], sources[perm], learner, omega, cfg)
    torch.testing.assert_close(out_p.advantages, out.advantages[perm], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_p.baselines, out.baselines[perm], rtol=1e-12, atol=1e-15)
