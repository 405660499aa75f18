"""Monte Carlo check of Theorem 4.1 (unbiased capability-weighted baseline) and Corollary 4.2.

Three agents with known success probabilities p_j answer the same prompts, G = 8 binary rewards each. With the
baseline weights set to the true ratios ω^(k,j) = p_k / p_j (Assumption D.1; all within [0.1, 10], so no
clipping is involved), E[μ̂^(k)] = p_k for every learner k. The code's uniform-reward and baseline guards are
switched off here: they replace μ̂ on some groups by other estimates and so bias it on purpose.
The tolerance is 5 standard errors of the mean over 20000 simulated groups.
"""
import torch

from openrlhf_hacpo.algorithms import AdvantageConfig, compute_advantages

P = torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)
N_AGENTS, G, GROUPS = 3, 8, 20000
NO_GUARDS = AdvantageConfig(uniform_reward_guard=False, baseline_guard=False, std_normalize=False)


def simulate(seed=1234):
    gen = torch.Generator().manual_seed(seed)
    sources = torch.arange(N_AGENTS).repeat_interleave(G).repeat(GROUPS)
    prompt_ids = torch.arange(GROUPS).repeat_interleave(N_AGENTS * G)
    rewards = (torch.rand(sources.numel(), generator=gen, dtype=torch.float64) < P[sources]).to(torch.float64)
    return rewards, prompt_ids, sources


def per_group(values):
    return values.view(GROUPS, N_AGENTS * G)[:, 0]


def test_weighted_baseline_is_unbiased_for_every_learner():
    rewards, prompt_ids, sources = simulate()
    for learner in range(N_AGENTS):
        omega = P[learner] / P  # true ratios ω^(k,j) = p_k / p_j
        out = compute_advantages(rewards, prompt_ids, sources, learner, omega, NO_GUARDS)
        baselines = per_group(out.baselines)
        se = baselines.std() / GROUPS ** 0.5
        assert abs(baselines.mean() - P[learner]) < 5 * se, (learner, baselines.mean().item(), se.item())

        # Corollary 4.2: the un-normalised advantage A = R − μ̂ of the learner's own samples has mean zero
        own_adv = out.advantages[sources == learner].view(GROUPS, G).mean(dim=1)
        se_adv = own_adv.std() / GROUPS ** 0.5
        assert abs(own_adv.mean()) < 5 * se_adv

        # the check has power: the plain joint mean estimates mean(p) = 0.5, not p_k
        plain = per_group(compute_advantages(rewards, prompt_ids, sources, learner, omega,
                                             AdvantageConfig(capability_weighting=False, uniform_reward_guard=False,
                                                             baseline_guard=False)).baselines)
        if abs(P.mean() - P[learner]) > 0.1:
            assert abs(plain.mean() - P[learner]) > 5 * plain.std() / GROUPS ** 0.5
