"""Agent-capability-aware group advantage (eqs. 6–8).

For learner k, a group is every row with the same prompt id: the n·G responses of all agents (``scope="joint"``)
or only the learner's own G (``scope="own"``, single-agent GSPO / GRPO, eq. 5). With ω^(k,j) = clip(P̂_k / P̂_j):

    μ̂^(k) = (1/|group|) Σ_{i ∈ group} ω^(k, src(i)) · R_i                           (eq. 7)
    σ     = unbiased std of the raw rewards in the group (σ = 1 for a group of one row)
    A_i   = (R_i − μ̂^(k)) / (σ + eps)                                              (eq. 6)

and A_i is given to every row of the group, own and foreign. Two guards from the official code (both on by
default, both switchable): a group whose rewards are all equal gets A = 0 with the plain mean as baseline, and a
capability-weighted baseline above ``baseline_guard_threshold`` is replaced by the mean of the learner's own
rewards in the group. The computation is vectorised over groups (``index_add_`` / ``scatter_reduce``) and keeps
the rewards' floating dtype and device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import AdvantageConfig

__all__ = ["AdvantageOutput", "compute_advantages"]


@dataclass
class AdvantageOutput:
    """Per-row advantage A_i, the baseline μ̂ subtracted from it and the group std σ (before ``eps``), each [N]."""

    advantages: torch.Tensor
    baselines: torch.Tensor
    stds: torch.Tensor


def _check_index_tensor(name: str, value: torch.Tensor, n_rows: int) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != 1 or value.numel() != n_rows:
        raise ValueError(f"{name} must have shape [{n_rows}] like rewards, got {tuple(value.shape)}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got dtype {value.dtype}")


def _validate(rewards, prompt_ids, sources, learner, omega) -> int:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if rewards.numel() == 0:
        raise ValueError("rewards is empty: compute_advantages needs at least one row")
    if not bool(torch.isfinite(rewards.to(torch.float64)).all()):
        raise ValueError("rewards contains NaN or inf")
    n_rows = rewards.numel()
    _check_index_tensor("prompt_ids", prompt_ids, n_rows)
    _check_index_tensor("sources", sources, n_rows)
    if not isinstance(omega, torch.Tensor):
        raise TypeError(f"omega must be a torch.Tensor, got {type(omega).__name__}")
    if omega.dim() != 1 or omega.numel() == 0:
        raise ValueError(f"omega must be a non-empty 1-D tensor [n agents], got shape {tuple(omega.shape)}")
    n_agents = omega.numel()
    omega64 = omega.detach().to(torch.float64)
    if not bool(torch.isfinite(omega64).all()) or bool((omega64 <= 0).any()):
        raise ValueError(f"omega must be finite and > 0 for every agent, got {omega64.tolist()}")
    if isinstance(learner, bool) or not isinstance(learner, int) or not 0 <= learner < n_agents:
        raise ValueError(f"learner must be an agent index in [0, {n_agents}), got {learner!r}")
    if abs(float(omega64[learner]) - 1.0) > 1e-12:
        raise ValueError(f"omega[learner] = ω^(k,k) must be 1, got {float(omega64[learner])!r}")
    bad = (sources < 0) | (sources >= n_agents)
    if bool(bad.any()):
        raise ValueError(
            f"sources contains unknown agent index {int(sources[bad][0])}; valid agents are 0..{n_agents - 1}"
        )
    return n_agents


def _check_equal_group_sizes(group: torch.Tensor, sources: torch.Tensor, unique_ids: torch.Tensor,
                             num_groups: int, n_agents: int) -> None:
    cells = torch.zeros(num_groups * n_agents, dtype=torch.long, device=group.device)
    cells.index_add_(0, group * n_agents + sources, torch.ones_like(group))
    counts = cells.view(num_groups, n_agents)
    present = counts.sum(dim=0) > 0
    counts = counts[:, present]
    unequal = (counts != counts[0, 0]).any(dim=1)
    if bool(unequal.any()):
        g = int(torch.nonzero(unequal)[0])
        agents = torch.nonzero(present).flatten().tolist()
        per_source = dict(zip(agents, counts[g].tolist()))
        expected = int(counts[0, 0])
        raise ValueError(
            f"unequal samples per source: prompt id {int(unique_ids[g])} has counts {per_source} "
            f"(agent: rows), expected {expected} for every source"
        )


def compute_advantages(
    rewards: torch.Tensor,
    prompt_ids: torch.Tensor,
    sources: torch.Tensor,
    learner: int,
    omega: torch.Tensor | None,
    cfg: AdvantageConfig | None = None,
) -> AdvantageOutput:
    """Capability-aware advantages of learner ``learner`` for every row (eqs. 6–8).

    Args:
        rewards: [N] verified rewards, one per trajectory.
        prompt_ids: [N] integer prompt id; rows with the same id form one group.
        sources: [N] index of the agent that generated each row.
        learner: index k of the agent being trained.
        omega: [n] baseline weights ω^(k,j) = clip(P̂_k / P̂_j) with ``omega[learner] == 1``, or ``None`` for all
            ones (plain mean).
        cfg: switches; defaults to :class:`AdvantageConfig`.

    Returns:
        :class:`AdvantageOutput` with ``advantages``, ``baselines`` and ``stds`` per row, in the rewards' floating
        dtype (float32 for integer rewards) on the rewards' device.
    """
    cfg = cfg if cfg is not None else AdvantageConfig()
    if omega is None:
        if not isinstance(sources, torch.Tensor) or sources.numel() == 0:
            raise ValueError("sources must be a non-empty tensor")
        omega = torch.ones(max(int(sources.max()), learner if isinstance(learner, int) else 0) + 1,
                           dtype=torch.float64)
    n_agents = _validate(rewards, prompt_ids, sources, learner, omega)

    dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.get_default_dtype()
    device = rewards.device
    r = rewards.detach().to(dtype)
    sources = sources.to(device=device, dtype=torch.long)
    unique_ids, group = torch.unique(prompt_ids.to(device), return_inverse=True)
    num_groups = unique_ids.numel()

    if cfg.require_equal_group_sizes:
        _check_equal_group_sizes(group, sources, unique_ids, num_groups, n_agents)

    own = sources == learner
    in_scope = own if cfg.scope == "own" else torch.ones_like(own)
    scope_w = in_scope.to(dtype)

    def group_sum(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=dtype, device=device).index_add_(0, group, values)

    count = group_sum(scope_w)
    if bool((count == 0).any()):
        g = int(torch.nonzero(count == 0)[0])
        raise ValueError(
            f"prompt id {int(unique_ids[g])} has no rows from learner {learner}; scope='own' needs them"
        )

    # eq. 7: μ̂ = mean over the group of ω^(k, src) · R (ω = 1 without capability weighting)
    if cfg.capability_weighting:
        weights = omega.detach().to(device=device, dtype=dtype)[sources]
    else:
        weights = torch.ones_like(r)
    baseline = group_sum(weights * r * scope_w) / count

    # σ: unbiased std of the raw rewards; a group of one row uses σ = 1
    plain_mean = group_sum(r * scope_w) / count
    centred = (r - plain_mean[group]) * scope_w
    variance = group_sum(centred * centred) / (count - 1).clamp(min=1)
    std = torch.where(count > 1, variance.sqrt(), torch.ones_like(variance))

    uniform = torch.zeros(num_groups, dtype=torch.bool, device=device)
    if cfg.uniform_reward_guard:
        neg_inf = torch.full_like(r, float("-inf"))
        pos_inf = torch.full_like(r, float("inf"))
        r_max = torch.full((num_groups,), float("-inf"), dtype=dtype, device=device).scatter_reduce(
            0, group, torch.where(in_scope, r, neg_inf), reduce="amax")
        r_min = torch.full((num_groups,), float("inf"), dtype=dtype, device=device).scatter_reduce(
            0, group, torch.where(in_scope, r, pos_inf), reduce="amin")
        uniform = r_max == r_min

    if cfg.baseline_guard and cfg.capability_weighting:
        own_w = own.to(dtype)
        own_count = group_sum(own_w)
        fires = (baseline > cfg.baseline_guard_threshold) & ~uniform
        orphan = fires & (own_count == 0)
        if bool(orphan.any()):
            g = int(torch.nonzero(orphan)[0])
            raise ValueError(
                f"baseline guard: prompt id {int(unique_ids[g])} has weighted baseline {float(baseline[g]):.6g} "
                f"> {cfg.baseline_guard_threshold} but no rows from learner {learner} to fall back on"
            )
        own_mean = group_sum(r * own_w) / own_count.clamp(min=1)
        baseline = torch.where(fires, own_mean, baseline)

    if cfg.uniform_reward_guard:
        # every in-scope reward equals r_max, which is then exactly the plain mean
        baseline = torch.where(uniform, r_max, baseline)

    numerator = r - baseline[group]
    advantages = numerator / (std[group] + cfg.eps) if cfg.std_normalize else numerator
    if cfg.uniform_reward_guard:
        advantages = torch.where(uniform[group], torch.zeros_like(advantages), advantages)
    return AdvantageOutput(advantages=advantages, baselines=baseline[group], stds=std[group])
