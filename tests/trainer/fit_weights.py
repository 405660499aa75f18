"""One controller fit that returns its per-step records and every agent's trained weights, and the comparisons of two
such fits (shared by the tests that compare two runs of the same configuration)."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from openrlhf_hacpo.trainer.controller import HACPOController


def fit_with_weights(cfg) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Fit ``cfg``; returns ``controller.history`` and each agent's full weights (rank 0's copy)."""
    controller = HACPOController(cfg)
    try:
        controller.fit()
        weights = []
        for group in controller.groups:
            if cfg.cluster.use_ray:  # every rank takes part in ZeRO-3's gathers; rank 0's copy is the full weights
                import ray

                weights.append(ray.get([p.state_dict_for_sync.remote() for p in group.policies])[0])
            else:
                weights.append(group.policies[0].state_dict_for_sync())
        return controller.history, weights
    finally:
        controller.close()


def assert_same_weights(want: dict[str, Any], got: dict[str, Any]) -> None:
    """Two runs' weights of one agent agree to float noise (rtol 1e-4, atol 1e-5), tensor by tensor, under the same
    names: where two exact schedules sum in another order."""
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name].float(), want[name].float(), rtol=1e-4, atol=1e-5, msg=name)


def assert_same_metrics(want: dict[str, Any], got: dict[str, Any]) -> None:
    """One agent's step record of two runs: every float that is not a timing or work figure (``time/``, ``perf/``,
    ``rollout/tokens_per_s``) agrees to float noise (rtol 1e-4, atol 1e-6). ``mismatch/*`` (the engines' log-probs
    against the scoring pass) is compared where both runs have it: ``--old_logp_from_update`` runs no scoring pass."""
    for key, value in want.items():
        if key.startswith(("time/", "perf/", "rollout/tokens_per_s")) or not isinstance(value, float):
            continue
        if key.startswith("mismatch/") and key not in got:
            continue
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (want["agent"], want["step"], key)
