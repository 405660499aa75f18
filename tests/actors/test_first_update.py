"""Old log-probs from the first update's forward (``old_logp_from_update``) give the full computation's updates.

One learner, own and foreign rows (HACPO's rule, foreign ratios inside and outside the window), 3 updates per step
(12 rows, 4 per update) or one. The full computation gets every own row's old log-prob mean from an independent
float64 forward of the pre-step model (a scoring pass without rounding); the saving runs the two phases of
:mod:`openrlhf_hacpo.actors.first_update`: its own rows start unscored, phase 1 returns their old log-probs (checked
against the float64 forward), phase 2 gets each row's old log-prob mean. Every optimizer step's gradient and the
parameters after it must agree (float32 noise), on both kernel backends.
"""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from hacpo_kernels.dispatch import interpreter_active
from hacpo_kernels.hacpo_loss import _hacpo_fwd_kernel
from openrlhf_hacpo.actors import first_update
from openrlhf_hacpo.rollout import Trajectory
from openrlhf_hacpo.utils.weighted import merge_weighted
from skipping_rig import PROMPTS, RESPONSES, Row, learner_batch, make_config, make_loop, make_model, mean_logps

BACKENDS = ["torch"] + (["triton"] if interpreter_active(_hacpo_fwd_kernel) else [])
# (prompt, response, own?, ratio s of foreign rows at the start, advantage). With 3 updates the stratified order puts
# one of the 3 own rows in each, so phase 1 scores the own rows of updates 1 and 2 without gradient
ROWS = [(0, 0, True, 1.0, 0.8), (1, 1, True, 1.0, -0.6), (2, 2, False, 0.9, 1.2), (3, 3, False, 0.5, 0.9),
        (0, 4, False, 1.3, -0.7), (1, 5, False, 0.6, -1.1), (2, 3, False, 1.5, 0.4), (3, 2, False, 0.93, -0.5),
        (0, 1, True, 1.0, 0.3), (1, 0, False, 0.55, 1.0), (2, 5, False, 1.4, 1.3), (3, 4, False, 0.97, 0.6)]


@torch.no_grad()
def token_logps64(model: torch.nn.Module, p: int, r: int) -> list[float]:
    """Float64 per-token log-probs of RESPONSES[r] after PROMPTS[p] (one unpadded forward)."""
    model64 = copy.deepcopy(model).double().eval()
    prompt, response = PROMPTS[p], RESPONSES[r]
    logits = model64(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1]
    return torch.log_softmax(logits, -1)[torch.arange(len(response)), torch.tensor(response)].tolist()


# GSPO: own rows only (the step's optimizer update then runs in phase 1)
OWN_ROWS = [(p, r, True, 1.0, a) for p, r, a in ((0, 0, 0.8), (1, 1, -0.6), (2, 2, 1.2), (3, 3, 0.9), (0, 4, -0.7),
                                                 (1, 5, 0.4))]


def run(backend: str, saving: bool, updates: int, algorithm: str = "hacpo"):
    model = make_model()
    table = ROWS if algorithm == "hacpo" else OWN_ROWS
    extra = ("--algorithm", algorithm, "--train_batch_size", str(len(table) // updates)) \
        + (("--old_logp_from_update",) if saving else ())
    loop = make_loop(model, make_config(backend, True, "clamp", micro=2, extra=extra), lr=5e-2)
    rows = [Row(p, r, own, math.log(s), a) for p, r, own, s, a in table]
    batch = learner_batch(rows, mean_logps(model))  # own rows: ℓ = 0, their mean from the float64 forward
    trajectories = [SimpleNamespace(source=0 if row.own else 1) for row in rows]
    loop.learner_batch = lambda trajs: batch
    loop.attach_advantages = lambda view, ratios: view.advantages.float()
    if not saving:
        result = loop.train_step(trajectories, step=1, ratios=None)
        return loop, result, None
    old_means = [r.old_logp_mean for r in batch.rows]
    for r in batch.rows:
        if r.is_own:  # unscored until phase 1
            r.old_logp_mean = math.nan
    phase = first_update.own_rows_first(loop, trajectories, 1, None)
    own = phase.old_logps
    for p, values in own.items():
        old_means[p] = math.fsum(values.tolist()) / len(values)
    return loop, first_update.finish_step(loop, phase, old_means), own


@pytest.mark.parametrize("backend, updates, algorithm", [("torch", 1, "hacpo"), ("torch", 3, "gspo")]
                         + [(backend, 3, "hacpo") for backend in BACKENDS])
def test_the_saving_gives_the_full_computations_updates(backend, updates, algorithm):
    full, full_result, _ = run(backend, False, updates, algorithm)
    saving, saving_result, own = run(backend, True, updates, algorithm)
    # phase 1 returns the pre-step old log-probs of every own row: the float64 forward's, to float32 noise
    model0 = make_model()
    table = ROWS if algorithm == "hacpo" else OWN_ROWS
    assert sorted(own) == [i for i, row in enumerate(table) if row[2]]
    for p, values in own.items():
        expected = torch.tensor(token_logps64(model0, *table[p][:2]), dtype=torch.float64)
        torch.testing.assert_close(values.double(), expected, rtol=0, atol=2e-6)
    grads_full, grads_saving = full.engine.step_grads, saving.engine.step_grads
    assert len(grads_full) == len(grads_saving) == updates
    assert float(grads_full[0].abs().max()) > 0
    for m, (a, b) in enumerate(zip(grads_full, grads_saving)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=lambda e: f"gradient of update {m}: {e}")
    for a, b in zip(full.engine.module.parameters(), saving.engine.module.parameters()):
        # AdamW's step m / (√v + ε) turns float noise on a gradient element near ε into up to lr·noise / ε
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    a, b = merge_weighted([full_result.metrics]), merge_weighted([saving_result.metrics])
    assert set(a) == set(b)
    for key in a:
        if not key.startswith("perf/pad_frac"):  # own and foreign rows are packed apart in the first update
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_a_trajectory_scored_by_its_learner():
    traj = Trajectory(prompt_id="p", prompt="1+1", label="2", response_text="2", source=0, source_token_ids=[5, 6, 3],
                      source_logp=[], source_logp_sum=None, source_num_tokens=2, finished=True)
    with pytest.raises(ValueError, match="no old log-probs yet"):
        traj.old_logp_mean
    with pytest.raises(ValueError, match="3 old log-probs for 2 action tokens"):
        traj.set_old_logps([-1.0, -2.0, -3.0])
    sums = first_update.old_logp_sums({0: torch.tensor([-1.0, -2.5])})
    assert sums == {0: (-3.5, 2)}
    with pytest.raises(ValueError, match="1 old log-probs for 2 action tokens"):
        first_update.record_old_logps([traj], [{0: (-3.5, 1)}])
    means = first_update.record_old_logps([traj], [sums])
    assert means == [-1.75] and traj.source_logp_sum == -3.5
    assert Trajectory.from_dict(traj.to_dict()) == traj


def test_a_policy_with_dropout_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    with pytest.raises(ValueError, match="agent 'a': --old_logp_from_update needs a policy without dropout"):
        first_update.check_dropout_free(model, "a")
    first_update.check_dropout_free(make_model(), "a")


def test_the_second_phase_needs_the_first():
    loop = make_loop(make_model(), make_config("torch", True, "clamp", extra=("--old_logp_from_update",)), lr=0.0)
    with pytest.raises(RuntimeError, match="agent 'a': finish_step without own_rows_first"):
        first_update.finish_step(loop, None, [])
