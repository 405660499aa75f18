"""What a learner logs about its view and its loss, as weighted means (:mod:`openrlhf_hacpo.utils.weighted`).

Each figure carries the weight it is averaged with across micro-batches, updates and ranks: row counts for view
sizes and advantages, own / foreign / positive-foreign row counts for the loss terms named by those prefixes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from openrlhf_hacpo.rollout import LearnerBatch
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["record_loss_metrics", "record_view_stats"]

_COUNTS = ("num_own", "num_foreign", "num_foreign_pos", "loss")


def record_view_stats(batch: LearnerBatch, advantages: torch.Tensor, stats: WeightedMeans,
                      agent_names: Sequence[str]) -> None:
    """Sizes, truncation, advantage and old log-prob statistics of a learner's view; per foreign source agent, the
    mean length of its responses in the learner's tokens (``view/foreign_tokens/<source>``) and the re-tokenization
    ratio, learner tokens over source tokens summed over its rows (``view/retokenization_ratio/<source>``)."""
    n_rows = float(len(batch))
    for key, value in batch.stats().items():
        if key != "num_rows":
            stats.add(f"view/{key}", value, n_rows)
    stats.add("view/num_rows", n_rows, 1.0)
    own = torch.tensor([r.is_own for r in batch.rows])
    n_own, n_foreign = float(own.sum()), float((~own).sum())
    stats.add("advantage/mean", float(advantages.mean()), n_rows)
    stats.add("advantage/std", float(advantages.std()) if len(batch) > 1 else 0.0, n_rows)
    stats.add("advantage/own_mean", float(advantages[own].mean()), n_own)
    stats.add("view/own_old_logp_mean", float(np.mean([r.old_logp_mean for r in batch.rows if r.is_own])), n_own)
    if n_foreign:
        stats.add("advantage/foreign_mean", float(advantages[~own].mean()), n_foreign)
        foreign_old = [r.old_logp_mean for r in batch.rows if not r.is_own]
        stats.add("view/foreign_old_logp_mean", float(np.mean(foreign_old)), n_foreign)
    for source in sorted({r.source for r in batch.rows if not r.is_own}):
        rows = [r for r in batch.rows if r.source == source]
        learner_tokens = sum(len(r.response_ids) for r in rows)
        source_tokens = sum(r.source_num_tokens for r in rows)
        name = agent_names[source]
        stats.add(f"view/foreign_tokens/{name}", learner_tokens / len(rows), float(len(rows)))
        if source_tokens:
            stats.add(f"view/retokenization_ratio/{name}", learner_tokens / source_tokens, float(source_tokens))


def record_loss_metrics(metrics: dict[str, float], stats: WeightedMeans) -> None:
    """One micro-batch's loss metrics as ``policy/<key>``, weighted by the rows they average over: ``own_*`` by
    own rows, ``foreign_pos_*`` by foreign rows with a positive advantage, ``foreign_*`` by foreign rows, the rest
    by all rows. The counts themselves and the loss (logged per update) are not recorded."""
    n_own, n_foreign = metrics.get("num_own", 0.0), metrics.get("num_foreign", 0.0)
    for key, value in metrics.items():
        if key in _COUNTS:
            continue
        if key.startswith("own_"):
            weight = n_own
        elif key.startswith("foreign_pos_"):
            weight = metrics.get("num_foreign_pos", 0.0)
        elif key.startswith("foreign_"):
            weight = n_foreign
        else:
            weight = n_own + n_foreign
        stats.add(f"policy/{key}", value, weight)
