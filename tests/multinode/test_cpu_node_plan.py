"""The node planner on CPU-only clusters: bundles of one CPU in place of GPUs, so pins and "an agent's workers share
a node" hold without GPUs, and a layout that does not fit is refused naming the agent, its need and every node's free
CPUs. Expectations are worked out by hand from the planner's rules (docs/multinode.md)."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.engines.node_plan import AgentDemand, ClusterNode, PlacementError, plan_nodes
from openrlhf_hacpo.trainer.preflight import check_node_placement

# two CPU raylets on one machine: the same address, told apart by their custom resources
A = ClusterNode("aa11" * 8, "192.0.2.2", 0, 4.0, frozenset({"nodeA"}))
B = ClusterNode("bb22" * 8, "192.0.2.2", 0, 3.0, frozenset({"nodeB"}))


def _cfg(*agents: AgentConfig, **kw) -> TrainConfig:
    sizes = dict(rollout_batch_size=4, n_samples_per_prompt=2, train_batch_size=8, micro_train_batch_size=1)
    return TrainConfig.of(agents=list(agents), prompt_data="unused.jsonl", **{**sizes, **kw})


def test_a_cpu_node_offers_its_whole_cpus_and_no_gpus():
    assert (A.capacity("CPU"), A.capacity("GPU")) == (4, 0)
    assert ClusterNode("c" * 32, "10.0.0.3", 0, 7.5).capacity("CPU") == 7


def test_pinned_agents_go_to_their_nodes_and_each_agents_ranks_share_one():
    demands = [AgentDemand("llama", dp=1, node="nodeA"), AgentDemand("qwen", dp=2, node="nodeB"),
               AgentDemand("big", dp=3)]
    plan = plan_nodes([A, B], demands, kind="CPU")
    # pins first: llama on A (3 CPUs left), qwen on B (1 left); big (3 ranks) fits only A
    assert plan[0].policy == (A.node_id,)
    assert plan[1].policy == (B.node_id,) * 2
    assert plan[2].policy == (A.node_id,) * 3
    assert all(p.engines == () for p in plan)


def test_unpinned_agents_take_the_node_with_most_free_cpus_largest_first():
    plan = plan_nodes([B, A], [AgentDemand("a", dp=1), AgentDemand("b", dp=2), AgentDemand("c", dp=2)], kind="CPU")
    # b (2, first of the largest) -> A (4 free); c (2) -> B (3 free vs 2); a (1) -> A and B tie at 2 free: the
    # lower address ties too, so the lower node id (A)
    assert [p.policy for p in plan] == [(A.node_id,), (A.node_id,) * 2, (B.node_id,) * 2]


def test_cpu_layout_that_fits_no_node_is_refused_naming_agent_need_and_free_cpus():
    demands = [AgentDemand("small", dp=2), AgentDemand("wide", dp=4, node="nodeB")]
    with pytest.raises(PlacementError) as err:
        plan_nodes([A, B], demands, kind="CPU")
    message = str(err.value)
    assert message.startswith("agent 'wide' cannot be placed on its pinned node: it needs 4 CPU bundle(s) on one "
                              "node for its policy (4 DeepSpeed rank(s)) (4 CPUs in all)")
    # the pinned agent is placed first, so every node is still empty
    assert "192.0.2.2 (aa11aa11): 4 of 4 CPUs free; 192.0.2.2 (bb22bb22): 3 of 3 CPUs free" in message
    assert "ray start --num-cpus" in message and "GPU" not in message
    with pytest.raises(PlacementError, match=r"agent 'c' cannot be placed on any node: .* 192\.0\.2\.2 \(aa11aa11\): "
                                             r"0 of 4 CPUs free; 192\.0\.2\.2 \(bb22bb22\): 3 of 3 CPUs free"):
        plan_nodes([A, B], [AgentDemand("a", dp=4), AgentDemand("c", dp=4)], kind="CPU")


def test_allow_straddle_splits_a_cpu_group_only_when_asked():
    demand = [AgentDemand("wide", dp=6)]
    with pytest.raises(PlacementError, match="--allow_straddle lets a group span nodes"):
        plan_nodes([A, B], demand, kind="CPU")
    (plan,) = plan_nodes([A, B], demand, allow_straddle=True, kind="CPU")
    assert plan.policy == (A.node_id,) * 4 + (B.node_id,) * 2


def test_cpu_engines_have_their_own_bundles_even_under_colocate_all_models():
    cfg = _cfg(AgentConfig(name="q", pretrain="/m/q", dp_size=2, vllm_num_engines=2, vllm_tensor_parallel_size=1),
               rollout_backend="vllm", colocate_all_models=True)
    ((gpu,), (cpu,)) = ([p.demand for p in plan_agents(cfg, on_gpu=True)],
                        [p.demand for p in plan_agents(cfg, on_gpu=False)])
    assert (gpu.colocated, gpu.policy_bundles, gpu.engine_bundles) == (True, 2, 0)
    assert (cpu.colocated, cpu.policy_bundles, cpu.engine_bundles) == (False, 2, 2)
    (plan,) = plan_nodes([A, B], [cpu], kind="CPU")
    assert plan.policy == (A.node_id,) * 2 and plan.engines == (A.node_id,) * 2  # 4 bundles: all on A


def test_preflight_plans_a_cpu_run_from_the_config_and_refuses_naming_the_agent():
    cfg = _cfg(AgentConfig(name="llama", pretrain="/m/l", node="nodeB"),
               AgentConfig(name="qwen", pretrain="/m/q", dp_size=2, node="nodeA"))
    plan = check_node_placement(plan_agents(cfg, on_gpu=False), [A, B])
    assert [p.nodes.policy for p in plan] == [(B.node_id,), (A.node_id,) * 2]
    cfg = _cfg(AgentConfig(name="qwen", pretrain="/m/q", dp_size=8))
    with pytest.raises(ValueError, match=r"agent 'qwen' cannot be placed on any node: it needs 8 CPU bundle\(s\)"):
        check_node_placement(plan_agents(cfg, on_gpu=False), [A, B])


def _ray_node(node_id: str, cpus: float, resource: str) -> dict:
    """An entry of ``ray.nodes()`` for a CPU raylet on this machine carrying ``resource``."""
    return {"NodeID": node_id, "NodeManagerAddress": "192.0.2.2", "Alive": True,
            "Resources": {"CPU": cpus, "memory": 1e9, resource: 1.0, "node:192.0.2.2": 1.0}}


def test_the_driver_plans_cpu_runs_on_multi_node_clusters_only(monkeypatch, tmp_path):
    import ray

    from openrlhf_hacpo.trainer.controller import HACPOController

    cfg = _cfg(AgentConfig(name="llama", pretrain="/m/l", node="nodeB"),
               AgentConfig(name="qwen", pretrain="/m/q", dp_size=2), save_path=str(tmp_path))
    controller = HACPOController(cfg)
    a, b = "a" * 32, "b" * 32
    # one node (a local Ray the driver starts): CPU workers reserve nothing, so nothing is planned or checked
    monkeypatch.setattr(ray, "nodes", lambda: [_ray_node(a, 1.0, "nodeA")])
    plans = plan_agents(cfg, on_gpu=False)
    assert [p.nodes for p in controller.cluster.place_on_nodes(plans)] == [None, None]
    monkeypatch.setattr(ray, "nodes", lambda: [_ray_node(a, 2.0, "nodeA"), _ray_node(b, 1.0, "nodeB")])
    llama, qwen = controller.cluster.place_on_nodes(plans)
    assert llama.nodes.policy == (b,) and qwen.nodes.policy == (a, a)
    monkeypatch.setattr(ray, "nodes", lambda: [_ray_node(a, 1.0, "nodeA"), _ray_node(b, 1.0, "nodeB")])
    with pytest.raises(PlacementError, match=r"agent 'qwen' cannot be placed on any node: it needs 2 CPU bundle\(s\)"
                                             r".* 1 of 1 CPUs free; .* 0 of 1 CPUs free"):
        controller.cluster.place_on_nodes(plans)
