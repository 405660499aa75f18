"""Which foreign rows of an update have exactly zero gradient: the probe, a forward without gradient that decides.

Learner k, foreign row i from source j, update m (eq. 11, each side normalised by its own token count):

    ℓ_i = mean_t log π_θ^(k)(y_i,t) − old_logp_mean_i,    s_i = exp(ℓ_i)

The row's objective depends on θ only through ℓ_i, so its gradient is ∂obj/∂ℓ_i · ∂ℓ_i/∂θ, and it is exactly zero
wherever ∂obj/∂ℓ_i = 0:

* HACPO (``clamp``): obj = c·sg(c)^α·ω^(j,k)·A with c = clamp(s, lo_m, hi), lo_m = min(1, 1 − δ + m·δ_step)
  (eqs. 10–14). Outside [lo_m, hi] the clamp passes no gradient whatever the sign of A.
* ``pessimistic``: obj = max(min(s·A, c·A), dual·A if A < 0)·sg(c)^α·ω: A > 0 keeps the gradient below the window,
  A < 0 above it up to the dual clip.
* Naive (the own-row clip on every row, eqs. 47–49): min(s·A, clip(s, 1 − ε_low, 1 + ε_high)·A) is flat for
  A > 0 above 1 + ε_high and for A < 0 below 1 − ε_low.
* the log-ratio clamp |ℓ| ≤ ``log_ratio_clip`` flattens every rule outside it; A = 0 has no gradient anywhere.
* the training-inference correction (``--rollout_is``) multiplies the objective by a weight that does not depend on
  θ: a row it masks (weight 0) has no gradient, one it keeps or truncates keeps the rule's.

The probe does not encode these cases: it evaluates the loss kernel itself (same rule, parameters, update index
m and correction inputs as the update) at the probe's log-probs and takes the gradient with respect to them. A row
is skipped only if that gradient is zero at ℓ_i and at ℓ_i ± ``SKIP_MARGIN``: the probe's forward and the update's
pack rows differently and may round ℓ_i differently in the last bits (about 1e-6 here), so a row within the margin
of an edge is trained. A skipped row goes through no forward with gradient and no backward, and nothing else changes:
each row's log-probs depend on that row alone (causal attention within the row), the loss denominators are the
global mini-batch totals (``LossTotals``), and the row's loss value and metrics are still counted, computed from the
probe's log-probs.

The probe packs rows as the update does: ``micro_train_batch_size`` rows per forward, grouped by length
(``length_grouping``). Each probe micro-batch reads the device at most three times: the gradient flags of the three
log-ratios with the finiteness of the log-probs (one loss call on the three stacked, whose metrics are not read),
then, when it skips rows, their loss's metrics and their entropy and finiteness. A probe reads once more on several
ranks, to agree on the number of its forwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from openrlhf_hacpo.actors.micro_loss import account
from openrlhf_hacpo.actors.rank_agreement import agree_on_count
from openrlhf_hacpo.actors.update_steps import UpdateSteps
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.algorithms import LossTotals
from openrlhf_hacpo.algorithms.losses import PolicyLossInput
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.rollout import LearnerBatch, MicroBatch
from openrlhf_hacpo.utils.padding import micro_batch_groups
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["ProbeResult", "SKIP_MARGIN", "ZeroGradProbe", "probe_enabled"]

SKIP_MARGIN = 1e-3
"""A foreign row is skipped only if its gradient would stay zero with its mean log-ratio moved by this much either
way (about 0.1% in s), so the float noise between the probe's forward and the update's cannot hide a contributing
row."""


def probe_enabled(cfg: TrainConfig) -> bool:
    """Whether foreign rows are tested for zero gradient (sequence ratios only). Decided by the config alone, so every
    rank of an agent probes (ZeRO-3's gathers are collective)."""
    return cfg.compute.skip_zero_grad_rows and cfg.trains_on_foreign and not cfg.algo.token_level_ratios


@dataclass
class ProbeResult:
    """``keep``: indices into the probed share of the foreign rows that need a backward pass, in share order;
    ``work``: the probe's packed positions; ``finite``: whether every probed value was finite."""

    keep: list[int] = field(default_factory=list)
    work: UpdateWork = field(default_factory=UpdateWork)
    finite: bool = True


class ZeroGradProbe:
    """The probe of one learner rank; ``loop`` (its public steps) supplies the forward, the loss and the settings."""

    def __init__(self, loop: UpdateSteps) -> None:
        self.loop = loop

    @torch.no_grad()
    def run(self, share: LearnerBatch, foreign: list[int], m: int, totals: LossTotals, params: Any,
            stats: WeightedMeans, foreign_ratios: list[torch.Tensor], terms: dict[str, float]) -> ProbeResult:
        """Score the rows ``foreign`` (indices into ``share``) without gradient and keep those that can contribute
        gradient; the skipped rows' loss value, terms and metrics are added to the records here."""
        loop, cfg = self.loop, self.loop.cfg
        groups = micro_batch_groups([len(share.rows[i].prompt_ids) for i in foreign],
                                    [len(share.rows[i].response_ids) for i in foreign],
                                    cfg.train.micro_train_batch_size, cfg.compute.length_grouping)
        count = agree_on_count(len(groups), loop.world_size, loop.device)
        result = ProbeResult()
        for g in range(count):
            if g >= len(groups):  # keep ZeRO-3's gathers in step with ranks that have more to probe
                loop.forward(share.select([0]).packed(loop.pad_token_id, loop.device))
                continue
            members = [foreign[j] for j in groups[g]]  # indices into share
            micro = share.select(members).packed(loop.pad_token_id, device=loop.device)
            result.work.count_probe(micro)
            scored = loop.forward(micro, with_entropy=True)
            has_grad = self.rows_with_gradient(micro, scored.logp, m, totals, params)
            if has_grad is None:  # non-finite log-probs: train every row, the update then skips as usual
                result.keep += members
                result.finite = False
                continue
            result.keep += [i for i, flag in zip(members, has_grad) if flag]
            skipped = [j for j, flag in enumerate(has_grad) if not flag]
            if skipped:
                sub = micro.select(skipped)
                out = loop.loss_of(sub, scored.logp[skipped], scored.entropy[skipped], m, totals, {}, params)
                if out is None:
                    result.keep += [members[j] for j in skipped]
                    result.finite = False
                else:
                    account(out, sub, stats, foreign_ratios, terms)
        result.keep.sort()
        return result

    def rows_with_gradient(self, micro: MicroBatch, logp: torch.Tensor, m: int, totals: LossTotals,
                           params: Any) -> list[bool] | None:
        """Per row: whether the loss gradient is non-zero at ``logp`` or at ``logp`` shifted by ±``SKIP_MARGIN``
        (the kernel and parameters of the update, one call on the three stacked); None when ``logp`` is not
        finite on the response tokens."""
        loop = self.loop
        mask = micro.response_mask
        shifts = (0.0, SKIP_MARGIN, -SKIP_MARGIN)
        with torch.enable_grad():
            probe = torch.cat([logp.detach() + s for s in shifts]).requires_grad_(True)
            inp = PolicyLossInput(logp=probe, mask=_tripled(mask), advantages=_tripled(micro.advantages),
                                  old_logp_mean=_tripled(micro.old_logp_mean), is_own=_tripled(micro.is_own),
                                  coef=_tripled(micro.coef), update_index=m, totals=totals,
                                  engine_logp=_tripled(micro.engine_logp),
                                  engine_logp_mean=_tripled(micro.engine_logp_mean),
                                  old_logp=_tripled(micro.old_logp) if micro.engine_logp is not None else None)
            out = loop.loss_fn(inp, loop.cfg.algo.loss, backend=loop.cfg.compute.kernel_backend,
                               params=_without_kl(params), check=False, metrics=False)
            (grad,) = torch.autograd.grad(out.loss, probe)
        has_grad = (grad * _tripled(mask) != 0).any(dim=1).view(len(shifts), -1).any(dim=0)
        finite = torch.isfinite(torch.where(mask > 0, logp, torch.zeros_like(logp))).all()
        *flags, ok = torch.cat([has_grad, finite.view(1)]).tolist()  # one read
        return [bool(f) for f in flags] if ok else None


def _tripled(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` stacked three times along its first dimension (one row block per log-ratio shift); None stays None."""
    return None if x is None else torch.cat([x, x, x])


def _without_kl(params: Any) -> Any:
    """The loss parameters without the KL term (the probe scores foreign rows, which carry no KL)."""
    return replace(params, kl_coef=0.0) if params.kl_coef else params
