"""The policy loss of one packed micro-batch and what it adds to an update's records.

A micro-batch carries everything its loss reads (advantages, coefficients, old and reference log-probs on the
device; row indices, ownership and lengths on the host), so computing and recording its loss reads the device twice:
the loss's metrics (one transfer inside the loss) and one transfer of the finiteness of the log-probs and of the loss
with the entropy sum. The foreign rows' ratios stay on the device until the step's end.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from openrlhf_hacpo.actors.learner_metrics import record_loss_metrics
from openrlhf_hacpo.algorithms import LossTotals
from openrlhf_hacpo.algorithms.losses import PolicyLossOutput
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.rollout import MicroBatch
from openrlhf_hacpo.utils.padding import pad_values
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["account", "loss_of", "zero_surrogate"]


def loss_of(loss_fn: Callable[..., PolicyLossOutput], cfg: TrainConfig, micro: MicroBatch, logp: torch.Tensor,
            entropy: torch.Tensor | None, m: int, totals: LossTotals, ref_logp: dict[int, torch.Tensor],
            params: Any) -> PolicyLossOutput | None:
    """The loss of ``micro`` at log-probs ``logp`` (with or without gradient) at update ``m``, or None when
    ``logp`` (on response tokens) or the loss is not finite. ``totals`` are the global mini-batch's counts, the
    loss's denominators; the reference log-probs are the micro-batch's own, else ``ref_logp`` by row index. The
    metrics carry the mean token entropy as ``entropy``, weighted by the micro-batch's tokens."""
    mask = micro.response_mask
    ref = None
    if cfg.algo.loss.uses_kl:  # own rows only; foreign rows and padding hold 0
        ref = micro.ref_logp if micro.ref_logp is not None else pad_values(
            [ref_logp[i] if own else None for i, own in zip(micro.rows, micro.own)], mask.shape[1]).to(mask.device)
    inp = micro.loss_input(logp, m, totals, ref_logp=ref, token_level=cfg.algo.token_level_ratios)
    out = loss_fn(inp, cfg.algo.loss, backend=cfg.compute.kernel_backend, params=params, check=False)
    values = logp.detach()
    finite = torch.isfinite(torch.where(mask > 0, values, torch.zeros_like(values))).all() \
        & torch.isfinite(out.loss.detach())
    entropy_sum = (entropy * mask).sum() if entropy is not None else torch.zeros((), device=mask.device)
    ok, entropy_sum = torch.stack([finite.to(torch.float32), entropy_sum.to(torch.float32)]).tolist()  # one read
    if not ok:
        return None
    if entropy is not None:
        tokens = float(micro.num_tokens)
        out.metrics["entropy"] = entropy_sum / max(tokens, 1.0)
        out.weights["entropy"] = tokens
    return out


def zero_surrogate(logp: torch.Tensor) -> torch.Tensor:
    """A zero loss built from a forward's outputs: a backward through it runs the same passes as a real loss (ZeRO-3's
    gather/reduce hooks stay in step on every rank) and no gradient reaches the parameters."""
    return (torch.nan_to_num(logp, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum()


def account(out: PolicyLossOutput, micro: MicroBatch, stats: WeightedMeans, foreign_ratios: list[torch.Tensor],
            terms: dict[str, float]) -> None:
    """Add one loss call's value, terms and metrics to an update's records; the sequence ratios of its foreign rows
    are appended to ``foreign_ratios`` (on the device)."""
    for name in terms:
        terms[name] += out.metrics[name]
    record_loss_metrics(out, stats)
    foreign = [j for j, own in enumerate(micro.own) if not own]
    if out.ratios is not None and foreign:
        foreign_ratios.append(out.ratios.detach()[foreign])
