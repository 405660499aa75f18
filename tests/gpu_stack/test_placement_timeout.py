"""A placement group Ray cannot place (GPUs the cluster does not have, or that another job holds) fails after the
timeout with the request and the cluster's GPU counts, and is removed so it does not keep waiting for GPUs.

A real local Ray cluster with no GPU stands for a full one: an agent asking for a GPU bundle can never be placed."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_without_gpus():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
    yield ray
    if started:
        ray.shutdown()


def _states(ray) -> list[str]:
    return [entry["state"] for entry in ray.util.placement_group_table().values()]


def test_wait_placement_group_times_out_naming_the_request_and_removes_the_group(ray_without_gpus):
    ray = ray_without_gpus
    from ray.util.placement_group import placement_group

    from openrlhf_hacpo.engines.placement import wait_placement_group

    group = placement_group([{"GPU": 1, "CPU": 1}] * 2, strategy="PACK")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^agent 'a': 2 policy GPUs: Ray could not place the placement group "
                                           r"within 2 s \(the cluster has 0 GPUs, 0 free\); lower the agents' GPU "
                                           r"counts or add nodes$"):
        wait_placement_group(group, 2.0, "agent 'a': 2 policy GPUs")
    waited = time.monotonic() - t0
    assert 2.0 <= waited < 30.0
    table = ray.util.placement_group_table(group)
    assert table["state"] == "REMOVED"


def test_an_agent_whose_gpus_cannot_be_placed_fails_at_launch(ray_without_gpus, tmp_path):
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.cli.train_hacpo import build_config

    cfg = build_config(["--agent", "name=big,pretrain=/m,dp_size=2", "--prompt_data", "x.jsonl",
                        "--save_path", str(tmp_path), "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
                        "--train_batch_size", "4", "--micro_train_batch_size", "1", "--init_kl_coef", "0"])
    group = AgentGroup(cfg, plan_agents(cfg, on_gpu=True)[0], total_updates=1)
    group.placement_timeout_s = 1.0
    with pytest.raises(TimeoutError, match=r"agent 'big': 2 GPU bundle\(s\) for its policy: Ray could not place .* "
                                           r"within 1 s \(the cluster has 0 GPUs, 0 free\)"):
        group.launch()
    assert group.policies == []  # no worker was started for a group that was never placed
    group.shutdown()  # nothing left to remove: no error
    assert "CREATED" not in _states(ray_without_gpus) and "PENDING" not in _states(ray_without_gpus)
