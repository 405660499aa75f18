"""Independent float64 references for the HACPO math, written as plain python loops over rows and groups.

They follow the formulas of docs/algorithm.md directly (no vectorisation, no autograd) so the tests compare the
library against a second, differently written implementation rather than against its own output.
"""
from __future__ import annotations

import math


def reference_advantages(rewards, prompt_ids, sources, learner, omega, *, weighting=True, scope="joint",
                         std_normalize=True, eps=1e-6, uniform_guard=True, baseline_guard=True, threshold=1.0):
    """Return (advantages, baselines, stds) as lists, eqs. 6–8 with the code's guards."""
    advantages, baselines, stds = [0.0] * len(rewards), [0.0] * len(rewards), [0.0] * len(rewards)
    for pid in sorted(set(prompt_ids)):
        rows = [i for i, p in enumerate(prompt_ids) if p == pid]
        members = [i for i in rows if scope == "joint" or sources[i] == learner]
        values = [rewards[i] for i in members]
        count = len(values)
        mean = sum(values) / count
        if count > 1:
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
        else:
            std = 1.0
        uniform = uniform_guard and max(values) == min(values)
        if weighting:
            baseline = sum(omega[sources[i]] * rewards[i] for i in members) / count
            if baseline_guard and not uniform and baseline > threshold:
                own = [rewards[i] for i in rows if sources[i] == learner]
                baseline = sum(own) / len(own)
        else:
            baseline = mean
        if uniform:
            baseline = values[0]
        for i in rows:
            if uniform:
                a = 0.0
            elif std_normalize:
                a = (rewards[i] - baseline) / (std + eps)
            else:
                a = rewards[i] - baseline
            advantages[i], baselines[i], stds[i] = a, baseline, std
    return advantages, baselines, stds


def lower_bound(m, delta, delta_step, stepwise=True):
    """Foreign lower clip bound, eq. 14 (eq. 13 when not stepwise)."""
    return min(1.0, 1.0 - delta + m * delta_step) if stepwise else 1.0 - delta


def reference_sequence_loss(logp, mask, advantages, old_logp_mean, is_own, coef, *, m=0, eps_low=3e-4,
                            eps_high=4e-4, delta=0.2, delta_step=0.025, alpha=1.0, log_ratio_clip=10.0,
                            stepwise=True, cross_clip=True, capability_coef=True, foreign_rule="cross",
                            num_seqs=None, cross_clip_high=1.0, cross_clip_mode="clamp", cross_clip_dual=3.0):
    """Sequence-level HACPO/GSPO/Naive loss with seq-mean-token-mean aggregation and no KL.

    Returns (loss, objectives, grad) where grad[i][t] = d loss / d logp[i][t] from the hand-derived derivative
    d obj / d log s: own (and Naive) rows s·A where the unclipped branch is active, foreign rows
    s^(α+1)·ω·A inside the window (Prop. D.6), 0 where the log-ratio clamp is active.
    """
    lo = lower_bound(m, delta, delta_step, stepwise)
    rows = len(logp)
    denom = rows if num_seqs is None else num_seqs
    objectives, grad = [], []
    for i in range(rows):
        tokens = [t for t, keep in enumerate(mask[i]) if keep]
        length = len(tokens)
        ell = sum(logp[i][t] for t in tokens) / length - old_logp_mean[i]
        clamped = log_ratio_clip is not None and abs(ell) > log_ratio_clip
        if clamped:
            ell = math.copysign(log_ratio_clip, ell)
        s = math.exp(ell)
        a = advantages[i]
        if is_own[i] or foreign_rule == "self_clip":
            clipped = min(max(s, 1.0 - eps_low), 1.0 + eps_high)
            obj = min(s * a, clipped * a)
            inside = 1.0 - eps_low <= s <= 1.0 + eps_high
            d_obj = s * a if (inside or s * a < clipped * a) else 0.0
        else:
            w = coef[i] if capability_coef else 1.0
            c = min(max(s, lo), cross_clip_high) if cross_clip else s
            if cross_clip and cross_clip_mode == "pessimistic":
                # min(s·A, c·A): the unclipped branch (with its gradient) wins inside the window, for A > 0
                # below it and for A < 0 above it
                # dual clip: a failure the learner finds more than cross_clip_dual times likelier is cut at dual·A
                value = min(s * a, c * a)
                dual_cut = a < 0 and cross_clip_dual * a > value
                obj = (cross_clip_dual * a if dual_cut else value) * c ** alpha * w
                active = s * a <= c * a and not dual_cut
            else:
                obj = c * c ** alpha * w * a
                active = (lo <= s <= cross_clip_high) or not cross_clip
            d_obj = s * c ** alpha * w * a if active else 0.0
        if clamped:
            d_obj = 0.0
        objectives.append(obj)
        grad.append([(-d_obj / length / denom) if keep else 0.0 for keep in mask[i]])
    loss = -sum(objectives) / denom
    return loss, objectives, grad


def reference_policy_loss(logp, mask, advantages, old_logp_mean, is_own, coef, *, m=0, eps_low=3e-4,
                          eps_high=4e-4, delta=0.2, delta_step=0.025, alpha=1.0, log_ratio_clip=10.0,
                          log_ratio_clip_mode="symmetric", stepwise=True, cross_clip=True, cross_clip_high=1.0,
                          cross_clip_mode="clamp", cross_clip_dual=3.0, foreign_rule="cross", token_level=False,
                          old_logp=None, loss_agg="seq-mean-token-mean", kl_coef=0.0, ref_logp=None,
                          num_seqs=None, num_tokens=None, num_own_seqs=None, num_own_tokens=None,
                          rollout_is=False, rollout_is_level="sequence", rollout_is_mode="truncate",
                          rollout_is_threshold=2.0, rollout_is_threshold_lower=None, engine_logp=None,
                          engine_logp_mean=None):
    """Every registered loss variant, one unit (row, or token at token level) at a time, in float64.

    Returns (loss, objectives, grad, kl). Units: a row with its sequence log-ratio (mean of its tokens minus
    ``old_logp_mean``), or a token with ``logp - old_logp``. Objective and its derivative d obj / d log-ratio per
    unit as in :func:`reference_sequence_loss`; a row's objective is the unit objective (sequence) or the mean over
    its tokens (token level). Aggregation: seq-mean-token-mean divides the sum of row objectives by ``num_seqs``;
    token-mean divides the sum over tokens by ``num_tokens``. KL: k3 = e^d − d − 1, d = clamp(ref − logp, ±20), on
    own tokens, aggregated the same way over own rows / own tokens; d k3 / d logp = 1 − e^d inside the clamp.

    Training-inference correction (``rollout_is``): each unit's objective (and its derivative) is multiplied by
    a constant weight rho = :func:`rollout_is_weight` of w, with w = exp(old_logp_mean − engine_logp_mean) for a row
    (every foreign row; own rows at level ``sequence``) and w = exp(old_logp − engine_logp) for an own token (level
    ``token``). With sequence ratios an own row at level ``token`` takes the mean of its tokens' rho over all its
    L tokens. Nothing else changes: masked units keep their place in every denominator (num_seqs, num_tokens, L).
    """
    lo = lower_bound(m, delta, delta_step, stepwise)
    rows = len(logp)
    lengths = [sum(1 for keep in mask[i] if keep) for i in range(rows)]
    own_rows = [i for i in range(rows) if is_own[i]]
    seq_den = num_seqs if num_seqs is not None else rows
    tok_den = num_tokens if num_tokens is not None else sum(lengths)
    own_seq_den = num_own_seqs if num_own_seqs is not None else max(len(own_rows), 1)
    own_tok_den = num_own_tokens if num_own_tokens is not None else max(sum(lengths[i] for i in own_rows), 1)
    token_mean = loss_agg == "token-mean"

    def clamp_ell(ell):
        if log_ratio_clip is None:
            return ell, True
        if log_ratio_clip_mode == "symmetric":
            return max(-log_ratio_clip, min(log_ratio_clip, ell)), -log_ratio_clip <= ell <= log_ratio_clip
        return min(ell, log_ratio_clip), ell <= log_ratio_clip

    def unit(ell, a, own, w):
        """(objective, d objective / d ell) of one unit."""
        ell, passes = clamp_ell(ell)
        s = math.exp(ell)
        if own or foreign_rule == "self_clip":
            clipped = min(max(s, 1.0 - eps_low), 1.0 + eps_high)
            obj = min(s * a, clipped * a)
            d = s * a if s * a <= clipped * a else 0.0
        else:
            w = w if foreign_rule == "cross" else 1.0
            c = min(max(s, lo), cross_clip_high) if cross_clip else s
            if cross_clip and cross_clip_mode == "pessimistic":
                value = min(s * a, c * a)
                dual_cut = a < 0 and cross_clip_dual * a > value
                obj = (cross_clip_dual * a if dual_cut else value) * c ** alpha * w
                d = s * c ** alpha * w * a if (s * a <= c * a and not dual_cut) else 0.0
            else:
                obj = c ** (alpha + 1) * w * a
                d = s * c ** alpha * w * a if ((lo <= s <= cross_clip_high) or not cross_clip) else 0.0
        return obj, (d if passes else 0.0)

    def row_weight(i):
        if not rollout_is:
            return 1.0
        return rollout_is_weight(math.exp(old_logp_mean[i] - engine_logp_mean[i]), rollout_is_mode,
                                 rollout_is_threshold, rollout_is_threshold_lower)

    def token_weight(i, t):
        if not rollout_is or not is_own[i] or rollout_is_level != "token":
            return row_weight(i)
        return rollout_is_weight(math.exp(old_logp[i][t] - engine_logp[i][t]), rollout_is_mode,
                                 rollout_is_threshold, rollout_is_threshold_lower)

    objectives, grad, total, kl_total = [], [], 0.0, 0.0
    for i in range(rows):
        tokens = [t for t, keep in enumerate(mask[i]) if keep]
        n = len(tokens)
        row_grad = [0.0] * len(mask[i])
        weight = 1.0 / tok_den if token_mean else 1.0 / (n * seq_den)  # d loss / d (token objective)
        if token_level:
            objs = []
            for t in tokens:
                o, d = unit(logp[i][t] - old_logp[i][t], advantages[i], is_own[i], coef[i])
                rho = token_weight(i, t)
                objs.append(rho * o)
                row_grad[t] = -weight * rho * d
            obj = sum(objs) / n
            total += sum(objs) / tok_den if token_mean else obj / seq_den
        else:
            ell = sum(logp[i][t] for t in tokens) / n - old_logp_mean[i]
            obj, d = unit(ell, advantages[i], is_own[i], coef[i])
            rho = sum(token_weight(i, t) for t in tokens) / n  # the row's weight when every token has it
            obj, d = rho * obj, rho * d
            total += obj * n / tok_den if token_mean else obj / seq_den
            for t in tokens:  # d ell / d logp_t = 1 / n; token-mean weighs the row by its n tokens
                row_grad[t] = -(d / tok_den if token_mean else d / (n * seq_den))
        if ref_logp is not None and is_own[i]:
            k3_sum = 0.0
            for t in tokens:
                raw = ref_logp[i][t] - logp[i][t]
                dd = max(-20.0, min(20.0, raw))
                k3_sum += math.exp(dd) - dd - 1.0
                dk3 = (1.0 - math.exp(dd)) if -20.0 <= raw <= 20.0 else 0.0
                scale = 1.0 / own_tok_den if token_mean else 1.0 / (n * own_seq_den)
                row_grad[t] += kl_coef * scale * dk3
            kl_total += k3_sum / own_tok_den if token_mean else k3_sum / n / own_seq_den
        objectives.append(obj)
        grad.append(row_grad)
    return -total + kl_coef * kl_total, objectives, grad, kl_total


def rollout_is_weight(w, mode, threshold, lower=None):
    """The applied training-inference correction weight of a raw weight w: truncate min(w, C); mask w inside
    [C_low, C] (C_low = ``lower``, else 1/C), else 0."""
    if mode == "truncate":
        return min(w, threshold)
    low = lower if lower is not None else 1.0 / threshold
    return w if low <= w <= threshold else 0.0
