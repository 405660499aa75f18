"""A skipped (non-finite) update does not advance the learning-rate schedule.

The engine is the policy worker's (``build_policy_engine``: DeepSpeed on gloo, world size 1) with
``constant_with_warmup`` over 4 warm-up updates, so the rate after n applied updates is base * min(n / 4, 1): by hand
0.25, 0.5, 0.75 of the base after 1, 2, 3 updates. A skip between them must leave the rate, and the scheduler's state
in the checkpoint, where they were.
"""
from __future__ import annotations


import pytest
import torch

from stack_fixtures import init_gloo_world, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

BASE_LR = 1e-3


def _update(built, ids: torch.Tensor, skip: bool) -> None:
    """One update as the policy worker runs it: set the skip flag before ``engine.step()``, clear it after."""
    engine, optimizer = built.engine, built.client_optimizer
    logits = engine(input_ids=ids).logits.float()
    loss = logits.pow(2).mean() * (0.0 if skip else 1.0)
    engine.backward(loss)
    optimizer.skip_next_step = skip
    engine.step()
    optimizer.skip_next_step = False


def _lr(built) -> float:
    return float(built.client_optimizer.param_groups[0]["lr"])


@pytest.mark.parametrize("stage", ["2", "3"])
def test_a_skipped_update_leaves_the_schedule_where_it_was(stage, bf16_tied_agent, tmp_path):
    from openrlhf_hacpo.actors.agent_plan import LoraPlan
    from openrlhf_hacpo.actors.deepspeed_setup import build_policy_engine

    init_gloo_world()
    cfg = worker_config(bf16_tied_agent, tmp_path, "--zero_stage", stage, "--lr_scheduler", "constant_with_warmup",
                        "--lr_warmup_steps", "4", "--actor_learning_rate", str(BASE_LR))
    built = build_policy_engine(cfg, cfg.resolved_agents[0], LoraPlan(), total_updates=8)
    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    assert _lr(built) == 0.0  # warm-up starts at 0 / 4

    _update(built, ids, skip=False)
    assert _lr(built) == pytest.approx(0.25 * BASE_LR, rel=1e-12)
    _update(built, ids, skip=True)
    assert _lr(built) == pytest.approx(0.25 * BASE_LR, rel=1e-12)
    assert built.engine.lr_scheduler.state_dict()["last_epoch"] == 1
    _update(built, ids, skip=False)
    assert _lr(built) == pytest.approx(0.5 * BASE_LR, rel=1e-12)
    _update(built, ids, skip=True)
    _update(built, ids, skip=True)
    _update(built, ids, skip=False)
    assert _lr(built) == pytest.approx(0.75 * BASE_LR, rel=1e-12)
    assert built.engine.lr_scheduler.state_dict()["last_epoch"] == 3
