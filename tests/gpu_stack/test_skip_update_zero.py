"""A skipped (non-finite) update leaves parameters and Adam state untouched under DeepSpeed ZeRO-1/2/3.

DeepSpeed's ZeRO wrappers call the client optimizer's ``step`` once per parameter group (ZeRO-1/2) or sub-group
(ZeRO-3) inside one ``engine.step()``. The skip is injected at update 3, when Adam's moments are non-zero: a group
that were stepped with a zero gradient would still move (m_t = β1·m_{t-1} ≠ 0) and its step counter would advance.
The engine runs in this process on gloo (world size 1); the caller protocol is the policy worker's: set
``skip_next_step`` before ``engine.step()``, clear it afterwards.
"""
from __future__ import annotations


import pytest
import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from stack_fixtures import init_gloo_world

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def _engine(stage: int):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    decay = [p for p in model.parameters() if p.ndim == 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = SkippableAdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=1e-2)
    zero = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        # several sub-groups per parameter group: ZeRO-3 steps the optimizer once per sub-group
        zero.update(stage3_param_persistence_threshold=0, sub_group_size=16)
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "zero_optimization": zero, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    return engine, optimizer


def _full_parameters(engine, stage: int) -> list[torch.Tensor]:
    import deepspeed

    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [p.detach().clone() for p in params]
    return [p.detach().clone() for p in params]


def _adam_state(optimizer: torch.optim.Optimizer) -> list[tuple[float, torch.Tensor]]:
    return [(float(state["step"]), state["exp_avg"].clone()) for state in optimizer.state.values()]


def _update(engine, optimizer, x: torch.Tensor, skip: bool) -> None:
    out = engine(x)
    # the worker's non-finite surrogate: a zero loss through the forward graph
    loss = out.pow(2).sum() * (0.0 if skip else 1.0)
    engine.backward(loss)
    optimizer.skip_next_step = skip
    engine.step()
    optimizer.skip_next_step = False


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_skipped_update_at_step_three_moves_nothing(stage, monkeypatch):
    init_gloo_world()
    engine, optimizer = _engine(stage)
    calls = []
    original_step = SkippableAdamW.step
    monkeypatch.setattr(SkippableAdamW, "step", lambda self, closure=None: (calls.append(1), original_step(self))[1])
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(1))
    _update(engine, optimizer, x, skip=False)
    assert len(calls) >= 2, f"ZeRO-{stage} was expected to step the client optimizer once per (sub-)group"
    _update(engine, optimizer, x, skip=False)
    params_before, state_before = _full_parameters(engine, stage), _adam_state(optimizer)
    assert state_before and all(step == 2.0 for step, _ in state_before)
    assert all(float(m.abs().max()) > 0 for _, m in state_before)

    _update(engine, optimizer, x, skip=True)
    for before, after in zip(params_before, _full_parameters(engine, stage)):
        assert torch.equal(before, after)
    for (step_before, m_before), (step_after, m_after) in zip(state_before, _adam_state(optimizer)):
        assert step_after == step_before == 2.0 and torch.equal(m_before, m_after)

    # the next clean update steps every group once more and moves the parameters
    _update(engine, optimizer, x, skip=False)
    assert all(step == 3.0 for step, _ in _adam_state(optimizer))
    assert any(not torch.equal(b, a) for b, a in zip(params_before, _full_parameters(engine, stage)))
