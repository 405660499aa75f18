"""Which rows each optimizer update of a step trains on, this rank's share of them, and the reference log-probs
of the own rows among them (the KL term)."""
from __future__ import annotations

from typing import Any

import torch

from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.rollout import LearnerBatch
from openrlhf_hacpo.utils.partition import split_evenly
from openrlhf_hacpo.utils.seeding import derive_seed

__all__ = ["my_share", "plan_updates", "reference_logprobs"]


def plan_updates(batch: LearnerBatch, cfg: TrainConfig, agent: AgentConfig, step: int,
                 world_size: int) -> list[LearnerBatch]:
    """The step's global mini-batches in update order m = 0, 1, ... (``max_epochs`` passes over the batch, each cut
    into ``len(batch) // train_batch_size`` mini-batches by ``--minibatch_order``)."""
    num_minibatches = len(batch) // cfg.train.train_batch_size
    plan = []
    for epoch in range(cfg.train.max_epochs):
        seed = derive_seed(cfg.train.seed, "minibatch", step, agent.name, epoch)
        plan.extend(batch.split_minibatches(num_minibatches, order=cfg.train.minibatch_order, seed=seed,
                                            dp_chunks=world_size))
    return plan


def my_share(minibatch: LearnerBatch, rank: int, world_size: int) -> LearnerBatch:
    """This rank's contiguous share of a global mini-batch (v1's data-parallel dispatch)."""
    return minibatch.select(split_evenly(len(minibatch), world_size)[rank])


def reference_logprobs(reference: Any, plan: list[LearnerBatch], cfg: TrainConfig, agent: AgentConfig, rank: int,
                       world_size: int) -> dict[int, torch.Tensor]:
    """Reference log-probs of this rank's own rows (the KL term covers own rows only), by row index. ``reference``
    is a Ray actor handle or a plain worker with ``compute_logprobs``."""
    if reference is None:
        raise RuntimeError(f"agent {agent.name!r}: kl_coef > 0 but no reference worker is attached")
    # a reference on the policy's own ZeRO-3 model (a LoRA agent's) gathers collectively: every rank scores its
    # whole share, so all ranks run the same number of forward passes
    every_row = world_size > 1 and agent.zero_stage == 3 and getattr(reference, "runs_on_policy_model", False)
    wanted: dict[int, Any] = {}
    for minibatch in plan:
        share = my_share(minibatch, rank, world_size)
        for row, index in zip(share.rows, share.row_ids):
            if row.is_own or every_row:
                wanted[index] = row
    indices = sorted(wanted)
    args = ([wanted[i].prompt_ids for i in indices], [wanted[i].response_ids for i in indices], cfg.rollout.temperature,
            cfg.compute.length_grouping)
    if hasattr(reference.compute_logprobs, "remote"):
        import ray

        values = ray.get(reference.compute_logprobs.remote(*args))
    else:
        values = reference.compute_logprobs(*args)
    return dict(zip(indices, values))
