"""Fault injection for in-process (``--no_ray``) training tests: one chosen update gets a NaN loss.

The worker's policy loss is wrapped so that update ``update_index`` of training step ``step`` returns its loss times
NaN (the metrics stay finite), which is what the worker must treat as a non-finite update and skip.
"""
from __future__ import annotations

import dataclasses


def nan_loss_at(worker, step: int, update_index: int) -> None:
    """Make the loss of update ``update_index`` of step ``step`` NaN on ``worker`` (a plain ``PolicyWorker``)."""
    updater = worker.updater
    loss_fn, train_step = updater.loss_fn, updater.train_step
    current = {"step": None}

    def train_step_recording_the_step(trajectories, step_, ratios):
        current["step"] = step_
        return train_step(trajectories, step_, ratios)

    def loss_with_nan(inp, cfg, **kwargs):
        out = loss_fn(inp, cfg, **kwargs)
        if (current["step"], inp.update_index) == (step, update_index):
            return dataclasses.replace(out, loss=out.loss * float("nan"))
        return out

    updater.train_step = train_step_recording_the_step
    updater.loss_fn = loss_with_nan
