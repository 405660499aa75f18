"""Checkpoint manager, metric sinks and pass@k, without models or workers."""
from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
import torch

from openrlhf_hacpo.trainer.checkpoint import CheckpointManager
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.utils.pass_at_k import pass_at_k
from openrlhf_hacpo.trainer.metrics import MetricsLogger
from openrlhf_hacpo.utils.jsonl import read_records


@pytest.mark.parametrize("n, c", [(1, 0), (1, 1), (4, 0), (4, 1), (4, 3), (5, 2), (6, 6)])
def test_pass_at_k_matches_enumeration(n, c):
    """pass@k = P(a random k-subset of the n samples holds a correct one), by enumerating all subsets."""
    samples = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def _state(step):
    return {"step": step, "tracker": {"history": [[0.5]]}, "rng": capture_rng_state()}


def test_checkpoint_save_is_atomic_and_pruned(tmp_path):
    manager = CheckpointManager(str(tmp_path / "ckpt"), max_keep=2)

    def write(tmp):
        (tmp / "agents" / "a").mkdir()
        (tmp / "agents" / "a" / "weights.bin").write_bytes(b"w")

    for step in (1, 2, 3):
        manager.save(step, _state(step), write)
    assert manager.steps() == [2, 3]
    assert manager.latest() == manager.path_for(3)
    assert json.loads((manager.path_for(3) / "trainer_state.json").read_text())["step"] == 3

    def crash(tmp):
        write(tmp)
        raise RuntimeError("killed while an agent was writing")

    with pytest.raises(RuntimeError, match="killed"):
        manager.save(4, _state(4), crash)
    # the interrupted save left nothing behind: the previous checkpoint and the pointer are intact
    assert manager.steps() == [2, 3]
    assert manager.latest() == manager.path_for(3)
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]
    assert manager.load_trainer_state(manager.latest())["step"] == 3


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = capture_rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_metrics_logger_sinks_and_resume_truncation(tmp_path):
    tb = tmp_path / "tb"
    logger = MetricsLogger(str(tmp_path), tensorboard_dir=str(tb), show_progress=True, total_steps=3)
    for step in (1, 2, 3):
        records = [{"step": step, "agent": name, "reward/mean": 0.1 * step, "capability": float("nan")}
                   for name in ("a", "b")]
        logger.log_step(step, records)
        logger.advance(records)
    logger.log_eval(2, [{"step": 2, "agent": "a", "accuracy": 0.5}])
    logger.close()
    rows = read_records(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["agent"]) for r in rows] == [(s, a) for s in (1, 2, 3) for a in ("a", "b")]
    assert rows[0]["capability"] is None  # non-finite values become JSON null
    assert list(tb.glob("events.out.tfevents.*"))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb))
    events.Reload()
    assert [e.value for e in events.Scalars("b/reward/mean")] == pytest.approx([0.1, 0.2, 0.3])
    assert [e.value for e in events.Scalars("eval/a/accuracy")] == pytest.approx([0.5])

    # a run resumed from step 2 drops the records written after it
    MetricsLogger(str(tmp_path), show_progress=False, initial_step=2).close()
    assert max(r["step"] for r in read_records(tmp_path / "metrics.jsonl")) == 2
    # a fresh run in the same folder starts empty
    MetricsLogger(str(tmp_path), show_progress=False, initial_step=0).close()
    assert read_records(tmp_path / "metrics.jsonl") == []


def test_metrics_logger_sends_scalars_to_wandb(tmp_path, monkeypatch):
    """The W&B sink with a stand-in ``wandb`` module: init arguments, one flat dict of scalars per step, finish."""
    calls = []

    class Run:
        def log(self, data, step):
            calls.append(("log", step, dict(data)))

        def finish(self):
            calls.append(("finish",))

    class FakeWandb:
        @staticmethod
        def init(**kwargs):
            calls.append(("init", kwargs))
            return Run()

    monkeypatch.setitem(__import__("sys").modules, "wandb", FakeWandb)
    logger = MetricsLogger(str(tmp_path), wandb={"project": "p", "name": "n", "mode": "offline", "config": {}},
                           show_progress=False)
    logger.log_step(1, [{"step": 1, "agent": "a", "loss": 0.5, "note": "text"}])
    logger.close()
    assert calls[0] == ("init", {"dir": str(tmp_path), "project": "p", "name": "n", "mode": "offline", "config": {}})
    assert calls[1] == ("log", 1, {"a/loss": 0.5})
    assert calls[2] == ("finish",)
