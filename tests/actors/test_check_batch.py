"""The loss's input rules, checked once per learner batch (``UpdateLoop.check_batch``): which batches are refused
and what the errors say. Rows are built by hand; nothing runs a forward."""
from __future__ import annotations

import pytest
import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from openrlhf_hacpo.actors.update_loop import UpdateLoop
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow
from plain_engine import PlainEngine, Tok

NAN, INF = float("nan"), float("inf")


def make_loop(algorithm: str) -> UpdateLoop:
    model = torch.nn.Linear(2, 2)
    agents = ["--agent", "name=a,pretrain=/m"] + (["--agent", "name=b,pretrain=/m"] if algorithm == "hacpo" else [])
    cfg = build_config([*agents, "--prompt_data", "x.jsonl", "--algorithm", algorithm, "--n_samples_per_prompt", "2",
                        "--rollout_batch_size", "1", "--train_batch_size", "2", "--micro_train_batch_size", "1"])
    optimizer = SkippableAdamW(model.parameters(), lr=1e-2)
    return UpdateLoop(cfg, cfg.resolved_agents[0], 0, 0, 1, PlainEngine(model, optimizer, gas=1), optimizer, Tok(),
                      None, torch.device("cpu"))


@pytest.fixture(scope="module")
def gspo():
    return make_loop("gspo")


@pytest.fixture(scope="module")
def hacpo():
    return make_loop("hacpo")


def rows(**change) -> LearnerBatch:
    """Three rows (responses of 2, 4 and 3 tokens; row 2 foreign with ``foreign=True``), then ``change``:
    ``advantages`` / ``coef`` (lists), or ``row<i>`` = a dict of LearnerRow fields."""
    base = [dict(prompt_ids=[1, 5], response_ids=[4, 6], old_logp=torch.tensor([-1.0, -2.0])),
            dict(prompt_ids=[2], response_ids=[4, 6, 7, 8], old_logp=torch.tensor([-1.0, -1.0, -1.0, -1.0])),
            dict(prompt_ids=[2, 9, 9], response_ids=[5, 5, 5], old_logp=torch.tensor([-0.5, -0.5, -0.5]))]
    foreign = change.pop("foreign", False)
    out = []
    for i, fields in enumerate(base):
        fields = {**fields, **change.pop(f"row{i}", {})}
        own = not (foreign and i == 2)
        out.append(LearnerRow(prompt_id=f"p{i}", is_own=own, source=0 if own else 1, reward=1.0,
                              old_logp_mean=fields.pop("old_logp_mean", -1.0),
                              **{**fields, "old_logp": fields["old_logp"] if own else None}))
    batch = LearnerBatch(learner=0, rows=out)
    batch.attach(torch.tensor(change.pop("advantages", [0.5, -0.5, 1.0]), dtype=torch.float64),
                 torch.tensor(change.pop("coef", [1.0, 1.0, 1.0]), dtype=torch.float64))
    assert not change
    return batch


def test_a_valid_batch_passes(gspo, hacpo):
    gspo.check_batch(rows())
    hacpo.check_batch(rows(foreign=True, coef=[1.0, 1.0, 0.25]))
    # per-token values past a row's own response (the padding of a shorter row) are not the loss's
    gspo.check_batch(rows(row0=dict(old_logp=torch.tensor([-1.0, -2.0, NAN]))))
    # rows without per-token old log-probs (sequence-level sources) pass as zeros
    gspo.check_batch(rows(row1=dict(old_logp=None)))
    # the extremes that still fit float32
    gspo.check_batch(rows(advantages=[3e38, -3e38, 0.0], coef=[1e-38, 3e38, 1.0]))


@pytest.mark.parametrize("change, message", [
    (dict(row1=dict(response_ids=[])), "agent 'a': learner row 1 has no response tokens"),
    (dict(advantages=[0.5, NAN, 1.0]), "PolicyLossInput.advantages contains NaN or inf"),
    (dict(advantages=[0.5, 0.0, -INF]), "PolicyLossInput.advantages contains NaN or inf"),
    (dict(advantages=[1e39, 0.0, 0.0]), "PolicyLossInput.advantages contains NaN or inf"),  # inf in float32
    (dict(row2=dict(old_logp_mean=NAN)), "PolicyLossInput.old_logp_mean contains NaN or inf"),
    (dict(row0=dict(old_logp_mean=-1e39)), "PolicyLossInput.old_logp_mean contains NaN or inf"),
    (dict(coef=[1.0, INF, 1.0]), "PolicyLossInput.coef contains NaN or inf"),
    (dict(coef=[1.0, 0.0, 1.0]), "PolicyLossInput.coef must be > 0 for every row"),
    (dict(coef=[1.0, 1.0, -0.5]), "PolicyLossInput.coef must be > 0 for every row"),
    (dict(coef=[1e-50, 1.0, 1.0]), "PolicyLossInput.coef must be > 0 for every row"),  # 0 in float32
    (dict(row1=dict(old_logp=torch.tensor([-1.0, -1.0, -1.0, NAN]))), "PolicyLossInput.old_logp contains NaN or inf"),
    (dict(row0=dict(old_logp=torch.tensor([-INF, -1.0]))), "PolicyLossInput.old_logp contains NaN or inf"),
    (dict(row2=dict(old_logp=torch.tensor([-1.0, -1.0], dtype=torch.float64))), None),  # short: zeros after
])
def test_refused_batches_and_their_messages(gspo, hacpo, change, message):
    for loop in (gspo, hacpo):
        batch = rows(**change)
        if message is None:
            loop.check_batch(batch)
            continue
        with pytest.raises(ValueError) as err:
            loop.check_batch(batch)
        assert str(err.value) == message


def test_own_only_losses_refuse_foreign_rows(gspo, hacpo):
    with pytest.raises(ValueError) as err:
        gspo.check_batch(rows(foreign=True))
    assert str(err.value) == ("policy loss 'gspo' trains on the learner's own rollouts only, got 1 foreign rows "
                              "(use 'hacpo' or 'naive' for shared rollouts)")
    hacpo.check_batch(rows(foreign=True))


def test_the_rules_come_before_the_own_row_rule(gspo):
    # a foreign row with a bad coefficient: the input rule speaks first, as the loss would check it
    with pytest.raises(ValueError, match=r"^PolicyLossInput\.coef must be > 0"):
        gspo.check_batch(rows(foreign=True, coef=[1.0, 1.0, 0.0]))


def test_an_unattached_batch_is_refused(gspo):
    batch = rows()
    batch.advantages = None
    with pytest.raises(ValueError, match=r"advantages and coefficients are not attached"):
        gspo.check_batch(batch)
