"""What a learner logs about its view and its loss, as weighted means (:mod:`openrlhf_hacpo.utils.weighted`).

Each figure carries the weight it is averaged with across micro-batches, updates and ranks: row counts for view
sizes and advantages; for the loss, the weights the loss itself declares for each of its metrics.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from openrlhf_hacpo.algorithms.losses import PolicyLossOutput
from openrlhf_hacpo.rollout import LearnerBatch
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["record_loss_metrics", "record_view_stats"]

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


def record_loss_metrics(out: PolicyLossOutput, stats: WeightedMeans) -> None:
    """One loss call's metrics as ``policy/<key>``, each with the weight the loss declares for it
    (:attr:`PolicyLossOutput.weights`: own-row metrics by own rows, foreign ones by foreign rows, token means by
    tokens, ...), so the merged figure is the same however rows are split into micro-batches. Counts, the loss and
    its two terms (summed per update by the update loop) have no weight and are not recorded here."""
    for key, weight in out.weights.items():
        if key in out.metrics:
            stats.add(f"policy/{key}", out.metrics[key], weight)
