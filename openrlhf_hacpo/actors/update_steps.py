"""The public steps of one learner rank's update, as a protocol: what the probe (:mod:`.zero_grad_probe`) and the
two-phase step (:mod:`.first_update`) call on :class:`~openrlhf_hacpo.actors.update_loop.UpdateLoop`.

Those two modules depend on this protocol and not on the loop, so the loop imports them one way. A step runs as

    prepared = prepare(trajectories, step, ratios)               # view, advantages, plan, reference log-probs
    for m, minibatch in enumerate(prepared.plan):                # run_updates(prepared, first) does this loop
        update = begin_update(minibatch, m, ...)                 # this rank's share, loss denominators, lr
        rows = rows_to_train(update, foreign)                    # the probe: rows with non-zero gradient
        backward(update, update.share.select(rows), boundary=True)  # micro-batches, then the optimizer step
        finish_update(update, step, work)                        # gradient norm, learning rate, counters

and every loss call, of the update and of the probe, goes through ``loss_of``.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch

from openrlhf_hacpo.actors.results import RankTrainResult
from openrlhf_hacpo.actors.step_state import PreparedStep, UpdateState
from openrlhf_hacpo.actors.update_work import UpdateWork
from openrlhf_hacpo.algorithms import CapabilityRatios, LossTotals
from openrlhf_hacpo.algorithms.losses import PolicyLossOutput
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.rollout import LearnerBatch, MicroBatch, Trajectory
from openrlhf_hacpo.utils.weighted import WeightedMeans

__all__ = ["MicroLoss", "UpdateSteps"]

MicroLoss = Callable[[MicroBatch], "tuple[torch.Tensor, PolicyLossOutput | None]"]
"""Forward and loss of one packed micro-batch: ``(loss to backward, its output or None when not finite)``."""


class UpdateSteps(Protocol):
    """One learner rank's training step in public steps (see the module docstring for their order)."""

    cfg: TrainConfig
    agent: AgentConfig
    agent_index: int
    rank: int
    world_size: int
    device: torch.device
    pad_token_id: int
    loss_fn: Callable[..., PolicyLossOutput]

    def prepare(self, trajectories: Sequence[Trajectory], step: int, ratios: CapabilityRatios) -> PreparedStep:
        """The step's view, advantages, update plan and reference log-probs."""

    def check_batch(self, batch: LearnerBatch) -> None:
        """The loss's input rules on the whole learner batch."""

    def run_updates(self, prepared: PreparedStep, first: int = 0) -> RankTrainResult:
        """Updates m = ``first``, ... of the plan, then the step's records."""

    def begin_update(self, minibatch: LearnerBatch, m: int, ref_logp: dict[int, torch.Tensor],
                     stats: WeightedMeans, foreign_ratios: list[torch.Tensor]) -> UpdateState:
        """The state of update m on global mini-batch ``minibatch``: this rank's share and the loss's settings."""

    def rows_to_train(self, update: UpdateState, foreign: list[int]) -> list[int]:
        """The probe of the share's rows ``foreign``: the share's rows that need a backward pass."""

    def backward(self, update: UpdateState, rows: LearnerBatch, boundary: bool,
                 micro_loss: MicroLoss | None = None) -> None:
        """Forward and backward of ``rows`` in micro-batches; with ``boundary`` the optimizer step after the last."""

    def finish_update(self, update: UpdateState, step: int,
                      work: UpdateWork | None = None) -> tuple[float | None, float]:
        """Book an update whose optimizer step has run: (gradient norm or None when skipped, learning rate)."""

    def forward(self, micro: MicroBatch, with_entropy: bool = False) -> Any:
        """Response log-probs (and entropies) of a packed micro-batch under the current policy."""

    def loss_of(self, micro: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor | None, m: int,
                totals: LossTotals, ref_logp: dict[int, torch.Tensor], params: Any) -> PolicyLossOutput | None:
        """The loss of ``micro`` at ``logp``, or None when it or the log-probs are not finite."""
