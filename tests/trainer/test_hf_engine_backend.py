"""The tiny main job's trainer with ``--rollout_backend hf_engine`` (an HFEngine actor beside each policy, weights
synced through the object store after every update) trains exactly as with the policy generating itself (``hf``):
two steps of both on the shipped agents give the same metrics and evaluations. The ``hf`` run is the same policy
code without Ray (``--no_ray``: each agent's PolicyWorker in this process), which saves starting a second set of
actors. Ray: the module's cluster of tests/trainer/conftest.py."""
from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.e2e

# wall-clock figures differ between any two runs; every other number of a record must agree
_TIMING_PREFIXES = ("time/", "rollout/tokens_per_s")


def _run(tmp_path, backend: str, *flags: str):
    from openrlhf_hacpo.cli.train_hacpo import run
    from openrlhf_hacpo.zoo import AGENTS, SHIPPED_DIR, Preset, RLHyperparams
    from openrlhf_hacpo.zoo.job import MainJobConfig, export_task_data, trainer_argv

    names = ("llamaS", "qwenM")
    rl = RLHyperparams(prompts_per_step=4, group_size=2, num_steps=2, eval_every=1, eval_size=8)
    preset = Preset("e2e", "model", "the shipped agents, two steps", tuple(AGENTS[n] for n in names), rl)
    cfg = MainJobConfig(preset=preset, seed=1, output=tmp_path / backend, progress=False,
                        extra_args=("--rollout_backend", backend, "--no_save_hf", "--no_final_checkpoint", *flags))
    data = export_task_data(rl, data_dir=tmp_path / "data")
    controller = run(trainer_argv(cfg, {n: SHIPPED_DIR / n for n in names}, data))
    return controller, tmp_path / backend


def _records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_engine_beside_the_policy_trains_as_the_policy_generating_itself(ray_cluster, tmp_path):
    policy_run, policy_dir = _run(tmp_path, "hf", "--no_ray")
    engine_run, engine_dir = _run(tmp_path, "hf_engine")
    assert all(not g.engines for g in policy_run.groups)
    assert all(len(g.engines) == 1 for g in engine_run.groups)
    placement = json.loads((engine_dir / "placement.json").read_text())
    assert all(len(roles["engines"]) == 1 for roles in placement.values())

    expected, actual = _records(policy_dir / "metrics.jsonl"), _records(engine_dir / "metrics.jsonl")
    assert [(r["step"], r["agent"]) for r in actual] == [(r["step"], r["agent"]) for r in expected]
    assert len(actual) == 2 * 2
    compared = 0
    for want, got in zip(expected, actual):
        assert got["time/sync"] > 0 and want["time/sync"] == 0  # the engines did receive the weights
        # the engine's own time in generate lies inside the driver's wait for it; the policy's is its generate phase
        assert 0 < got["time/engine_generate"] <= got["time/generate"]
        assert want["time/engine_generate"] == want["time/generate"]
        assert set(got) == set(want)
        for key, value in want.items():
            if key.startswith(_TIMING_PREFIXES) or not isinstance(value, (int, float)):
                continue
            assert math.isclose(got[key], value, rel_tol=1e-5, abs_tol=1e-6), (got["step"], got["agent"], key)
            compared += 1
    assert compared > 4 * 30
    # the step-2 rollouts came from the synced weights: rewards and response lengths of step 2 agree as well
    # (compared above); the evaluations before, between and after the steps used the engines too
    evals = {(r["step"], r["agent"]): r for r in _records(engine_dir / "eval.jsonl")}
    for row in _records(policy_dir / "eval.jsonl"):
        other = evals[(row["step"], row["agent"])]
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isclose(other[key], value, rel_tol=1e-9, abs_tol=1e-12), (row["step"], key)
    assert sorted({s for s, _ in evals}) == [0, 1, 2]
