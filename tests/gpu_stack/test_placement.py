"""Placement arithmetic of vLLM engines (bundles, GPU shares, the environment vLLM's Ray executor reads), CPU core
spreading, the device-dependent engine defaults and the rendezvous address and gloo interface of an agent's group;
hand-computed expectations, no Ray or GPU needed."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.engines.placement import (
    EnginePlacement,
    plan_engine_placements,
    ray_noset_visible_devices,
    spread_cpu_cores,
)
from openrlhf_hacpo.engines.settings import EngineSettings, resolve_engine_settings
from openrlhf_hacpo.utils.network import gloo_interface, rendezvous_host


def test_dedicated_engines_with_tensor_parallelism_get_disjoint_whole_gpus():
    plan = plan_engine_placements(num_engines=2, tensor_parallel_size=4, colocated=False)
    assert plan == [EnginePlacement(0, 0.0, (0, 1, 2, 3), 1.0), EnginePlacement(4, 0.0, (4, 5, 6, 7), 1.0)]
    assert plan[1].vllm_env() == {"VLLM_RAY_BUNDLE_INDICES": "4,5,6,7", "VLLM_RAY_PER_WORKER_GPUS": "1.0"}


def test_colocated_engines_take_a_share_of_the_policy_bundles_in_node_order():
    # Ray placed bundles 0, 2 on node A and 1, 3 on node B: each engine's shards must stay on one node
    node_order = [0, 2, 1, 3]
    plan = plan_engine_placements(num_engines=2, tensor_parallel_size=2, colocated=True, bundle_order=node_order)
    assert [p.worker_bundles for p in plan] == [(0, 2), (1, 3)]
    assert [p.bundle_index for p in plan] == [0, 1]
    assert all(p.actor_gpus == 0.0 and p.per_worker_gpus == 0.2 for p in plan)
    assert plan[0].vllm_env() == {"VLLM_RAY_BUNDLE_INDICES": "0,2", "VLLM_RAY_PER_WORKER_GPUS": "0.2"}


def test_tensor_parallel_size_one_places_the_actor_itself():
    dedicated = plan_engine_placements(3, 1, colocated=False)
    colocated = plan_engine_placements(3, 1, colocated=True)
    assert [(p.bundle_index, p.actor_gpus, p.worker_bundles) for p in dedicated] == [(0, 1.0, None), (1, 1.0, None),
                                                                                     (2, 1.0, None)]
    assert [p.actor_gpus for p in colocated] == [0.2, 0.2, 0.2]
    assert all(p.vllm_env() == {} for p in dedicated + colocated)


def test_every_bundle_of_n_agents_layouts_is_used_at_most_once_per_engine():
    for engines, tp in [(1, 1), (2, 2), (4, 2), (3, 1), (1, 8)]:
        plan = plan_engine_placements(engines, tp, colocated=True)
        used = [b for p in plan for b in (p.worker_bundles or (p.bundle_index,))]
        assert sorted(used) == list(range(engines * tp))


def test_too_few_bundles_is_reported_with_the_counts():
    with pytest.raises(ValueError, match="2 engines of tensor-parallel size 2 need 4 bundles, the placement group "
                                         "has 3"):
        plan_engine_placements(2, 2, colocated=True, bundle_order=[0, 1, 2])


def test_cpu_engines_of_several_agents_get_their_own_cores():
    assert spread_cpu_cores(2, [0, 1]) == ["0", "1"]
    assert spread_cpu_cores(3, range(8)) == ["0,1", "2,3", "4,5"]
    assert spread_cpu_cores(2, [4, 5, 6, 7], cores_per_engine=1) == ["4", "5"]
    # more engines than cores: round-robin, one core each
    assert spread_cpu_cores(3, [0, 1]) == ["0", "1", "0"]
    with pytest.raises(ValueError, match="no CPU cores"):
        spread_cpu_cores(1, [])


def test_ray_noset_visible_devices_reads_the_ray_variables():
    assert ray_noset_visible_devices({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})
    assert not ray_noset_visible_devices({"CUDA_VISIBLE_DEVICES": "0"})
    assert not ray_noset_visible_devices({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": ""})


def test_engine_defaults_per_device_and_layout():
    assert resolve_engine_settings(on_gpu=False, colocated=False) == EngineSettings(True, 0.95, False)
    assert resolve_engine_settings(on_gpu=True, colocated=False) == EngineSettings(False, 0.95, False)
    assert resolve_engine_settings(on_gpu=True, colocated=True) == EngineSettings(False, 0.5, True)
    given = resolve_engine_settings(True, True, enforce_eager=True, gpu_memory_utilization=0.4, enable_sleep=False)
    assert given == EngineSettings(True, 0.4, False)
    with pytest.raises(ValueError, match="--vllm_enable_sleep needs GPU engines"):
        resolve_engine_settings(on_gpu=False, colocated=False, enable_sleep=True)


@pytest.mark.parametrize("use_gpu, colocate, dp, engines, tp, expected", [
    (False, False, 1, 1, 1, "object_store"),
    (True, False, 2, 2, 1, "broadcast"),
    (True, True, 2, 2, 1, "cuda_ipc"),
    (True, True, 2, 1, 2, "cuda_ipc"),
    (True, True, 1, 1, 2, "object_store"),  # an engine GPU without a policy rank has no one to hand it handles
])
def test_weight_sync_path_per_layout(use_gpu, colocate, dp, engines, tp, expected):
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.config import AgentConfig, TrainConfig

    agent = AgentConfig(name="a", pretrain="/models/a", dp_size=dp, vllm_num_engines=engines,
                        vllm_tensor_parallel_size=tp)
    cfg = TrainConfig.of(agents=[agent], prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=2,
                      n_samples_per_prompt=2, train_batch_size=4, micro_train_batch_size=1,
                      colocate_all_models=colocate)
    assert AgentGroup(cfg, plan_agents(cfg, on_gpu=use_gpu)[0], total_updates=1).weight_sync_mode() == expected


def test_cpu_engines_of_each_agent_take_the_next_core_ranges():
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.config import AgentConfig, TrainConfig

    agents = [AgentConfig(name="a", pretrain="/m/a", vllm_num_engines=1),
              AgentConfig(name="b", pretrain="/m/b", vllm_num_engines=2)]
    cfg = TrainConfig.of(agents=agents, prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=2,
                      n_samples_per_prompt=2, train_batch_size=4, micro_train_batch_size=1)
    a, b = plan_agents(cfg, on_gpu=False)
    assert a.cpu_core_binds({5, 4, 3, 2, 1, 0}) == ["0,1"]
    assert b.cpu_core_binds(range(6)) == ["2,3", "4,5"]


def test_actor_device_follows_the_gpu_ray_assigned_when_ray_leaves_visible_devices_alone(monkeypatch):
    """With RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES every GPU is visible to every actor: the worker must select
    its own GPU (Ray's assignment), not device 0. Without the variable the current device is kept."""
    import ray
    import torch

    from openrlhf_hacpo.engines.placement import actor_device

    selected = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: selected.append(index))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: selected[-1] if selected else 0)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ["3"])
    monkeypatch.delenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", raising=False)
    assert actor_device() == torch.device("cuda", 0) and selected == []
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    assert actor_device() == torch.device("cuda", 3) and selected == [3]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert actor_device() == torch.device("cpu")


# ---------------------------------------------------------------------------------------------------- rendezvous
INTERFACES = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.2", "fe80::1"], "ib0": ["192.168.7.2"], "docker0": []}


@pytest.mark.parametrize("started_local_ray, bind_host, expected", [
    (True, "127.0.0.1", "127.0.0.1"),     # the run's own local Ray: every rank on this machine
    (True, "192.168.7.2", "192.168.7.2"),  # ... on the interface --bind_host names
    (False, "127.0.0.1", "10.0.0.2"),     # joined a cluster (any route): rank 0's node address
])
def test_rendezvous_host_is_loopback_only_for_a_run_that_started_its_own_ray(started_local_ray, bind_host, expected):
    assert rendezvous_host(started_local_ray, bind_host, node_address="10.0.0.2") == expected


@pytest.mark.parametrize("own_address, expected", [("127.0.0.1", "lo"), ("localhost", "lo"), ("10.0.0.2", "eth0"),
                                                   ("192.168.7.2", "ib0"), ("10.9.9.9", None)])
def test_gloo_interface_is_the_one_holding_the_ranks_own_address(own_address, expected):
    assert gloo_interface(own_address, INTERFACES) == expected
