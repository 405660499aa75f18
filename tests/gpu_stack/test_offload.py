"""Optimizer and parameter offload, and DeepSpeed state sleep, in the policy worker's DeepSpeed engine.

Each engine is ``build_policy_engine``'s (the 2-layer Qwen3 of ``bf16_tied_agent`` trained in fp32, DeepSpeed on gloo,
world size 1), so the offload settings travel the project's own path: ``build_ds_config`` adds ``offload_optimizer``
/ ``offload_param`` and ``build_optimizer`` picks the skippable CPU Adam. The reference is the same engine without
offload, fed the same batches: the offloaded engine's parameters must follow it within float tolerance (the CPU
Adam's vectorised arithmetic rounds differently from torch's AdamW). A skip is injected when Adam's moments are
non-zero (a group stepped with a zero gradient would still move and count a step), and is checked against copies of
the parameters, moments and step counters taken before it. The first test to build the CPU Adam JIT-compiles DeepSpeed's
``cpu_adam`` op unless ``scripts/install.sh`` prebuilt it in ``TORCH_EXTENSIONS_DIR``.
"""
from __future__ import annotations

import copy

import pytest
import torch

from stack_fixtures import init_gloo_world, worker_config

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

LR = 1e-3
TOLERANCE = 2e-6
"""Largest |offloaded - reference| parameter difference accepted: each update moves every weight by about LR = 1e-3,
fp32 rounding of O(1) weights is ~1e-7 per update."""


def _build(agent_path: str, tmp_path, stage: int, *flags: str):
    from openrlhf_hacpo.actors.agent_plan import LoraPlan
    from openrlhf_hacpo.actors.deepspeed_setup import build_policy_engine

    init_gloo_world()
    cfg = worker_config(agent_path, tmp_path, "--zero_stage", str(stage), "--lr_scheduler", "constant",
                        "--actor_learning_rate", str(LR), *flags)
    return build_policy_engine(cfg, cfg.resolved_agents[0], LoraPlan(), total_updates=8)


def _batch(seed: int) -> torch.Tensor:
    return torch.randint(3, 200, (4, 10), generator=torch.Generator().manual_seed(seed))


def _update(built, ids: torch.Tensor, skip: bool = False, sleep: bool = False) -> None:
    """One update as the policy worker runs it (skip flag set before ``engine.step()``, cleared after); ``sleep``
    sends the engine's states away and back first, as a colocated generation does."""
    if sleep:
        built.states.sleep()
        assert built.states.asleep
        built.states.wake()
    loss = built.engine(input_ids=ids, labels=ids).loss * (0.0 if skip else 1.0)
    built.engine.backward(loss)
    built.client_optimizer.skip_next_step = skip
    built.engine.step()
    built.client_optimizer.skip_next_step = False


def _parameters(built) -> dict[str, torch.Tensor]:
    import deepspeed

    named = list(built.engine.module.named_parameters())
    if built.engine.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
            return {n: p.detach().float().clone() for n, p in named}
    return {n: p.detach().float().clone() for n, p in named}


def _adam_state(built) -> list[dict[str, object]]:
    return [copy.deepcopy({k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()})
            for state in built.client_optimizer.state.values()]


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        diff = float((got[name] - want[name]).abs().max())
        assert diff <= TOLERANCE, f"{name}: |offloaded - reference| = {diff:.3g}"


def _assert_skip_moves_nothing(built, ids: torch.Tensor) -> None:
    params, state = _parameters(built), _adam_state(built)
    assert state and all(float(s["step"]) == 2 for s in state)
    assert all(float(s["exp_avg"].abs().max()) > 0 for s in state)
    _update(built, ids, skip=True)
    after = _parameters(built)
    assert all(torch.equal(params[n], after[n]) for n in params)
    for before, now in zip(state, _adam_state(built)):
        assert float(now["step"]) == float(before["step"]) == 2
        assert torch.equal(now["exp_avg"], before["exp_avg"]) and torch.equal(now["exp_avg_sq"], before["exp_avg_sq"])
    assert built.engine.lr_scheduler.state_dict()["last_epoch"] == 2  # the skip did not advance the schedule


@pytest.mark.parametrize("stage, flags", [(2, ("--adam_offload", "--deepspeed_enable_sleep")),
                                          (3, ("--param_offload", "--adam_offload"))],
                         ids=["zero2-adam_offload-sleep", "zero3-param_offload-adam_offload"])
def test_offloaded_updates_follow_the_on_device_engine_and_skip_exactly(stage, flags, bf16_tied_agent, tmp_path):
    reference = _build(bf16_tied_agent, tmp_path / "ref", stage)
    offloaded = _build(bf16_tied_agent, tmp_path / "off", stage, *flags)
    assert offloaded.engine.zero_cpu_offload()  # optimizer states and the update on the CPU
    assert (offloaded.engine.zero_offload_param() is not None) == ("--param_offload" in flags)
    assert type(offloaded.client_optimizer).__name__ == "SkippableCPUAdam"
    initial = _parameters(reference)
    _assert_close(_parameters(offloaded), initial)
    sleep = "--deepspeed_enable_sleep" in flags
    for seed in (1, 2):
        _update(reference, _batch(seed))
        _update(offloaded, _batch(seed), sleep=sleep)
    moved = _parameters(reference)
    assert all(float((moved[n] - initial[n]).abs().max()) > 100 * TOLERANCE for n in initial)
    _assert_close(_parameters(offloaded), moved)
    _assert_skip_moves_nothing(offloaded, _batch(3))
    _update(reference, _batch(4))
    _update(offloaded, _batch(4), sleep=sleep)
    _assert_close(_parameters(offloaded), _parameters(reference))


def test_zero2_state_sleep_between_updates_changes_nothing(bf16_tied_agent, tmp_path):
    """Without adam_offload the sleep moves every state (weights, gradients, fp32 masters, Adam moments): on the
    CPU nothing travels, but DeepSpeed's ``offload_states`` / ``reload_states`` rebuild the buffers' links, and the
    updates must stay bit-identical to an engine that never slept."""
    reference = _build(bf16_tied_agent, tmp_path / "ref", 2)
    sleeping = _build(bf16_tied_agent, tmp_path / "sleep", 2, "--deepspeed_enable_sleep")
    for seed in (1, 2):
        _update(reference, _batch(seed))
        _update(sleeping, _batch(seed), sleep=True)
    want, got = _parameters(reference), _parameters(sleeping)
    assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("stage, flags", [(2, ("--adam_offload",)), (3, ("--param_offload", "--adam_offload"))],
                         ids=["zero2-adam_offload", "zero3-param_offload-adam_offload"])
def test_offloaded_checkpoint_resumes_exactly(stage, flags, bf16_tied_agent, tmp_path):
    """Save after update 1 (the policy worker's ``PolicyIO.save_checkpoint``), load into a fresh engine, take update 2
    on both: the same parameters, bit for bit."""
    from openrlhf_hacpo.actors.policy_io import PolicyIO

    agent = worker_config(bf16_tied_agent, tmp_path, "--zero_stage", str(stage), *flags).resolved_agents[0]
    first = _build(bf16_tied_agent, tmp_path / "a", stage, *flags)
    _update(first, _batch(1))
    cpu = torch.device("cpu")
    PolicyIO(agent, first.engine, None, 0, 1, cpu).save_checkpoint(str(tmp_path / "ckpt"), {"updates_done": 1})
    resumed = _build(bf16_tied_agent, tmp_path / "b", stage, *flags)
    saved = PolicyIO(agent, resumed.engine, None, 0, 1, cpu).load_checkpoint(str(tmp_path / "ckpt"))
    assert saved["updates_done"] == 1
    _update(first, _batch(2))
    _update(resumed, _batch(2))
    want, got = _parameters(first), _parameters(resumed)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert [float(s["step"]) for s in _adam_state(resumed)] == [float(s["step"]) for s in _adam_state(first)]

