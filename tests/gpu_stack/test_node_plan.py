"""The node planner on 2 nodes × 8 GPUs: each agent's policy, reference and engines on one node when they fit, no
DeepSpeed group or TP engine across nodes, pins honoured, refusals that name the agent and every node's free GPUs,
the same plan whatever order the nodes are listed in. Expectations are worked out by hand from the rules."""
from __future__ import annotations

import itertools

import pytest

from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.engines.node_plan import (
    AgentDemand,
    AgentPlacement,
    ClusterNode,
    PlacementError,
    cross_node_sync_bytes,
    nodes_from_ray,
    plan_nodes,
)
from openrlhf_hacpo.trainer.preflight import check_node_placement

A = ClusterNode("aa11" * 8, "10.0.0.1", 8, 8.0, frozenset({"nodeA", "node:10.0.0.1", "zone=a"}))
B = ClusterNode("bb22" * 8, "10.0.0.2", 8, 8.0, frozenset({"nodeB", "node:10.0.0.2", "zone=b"}))
NODES = [A, B]


def planned_demands(cfg: TrainConfig) -> list[AgentDemand]:
    """The demands of the agents' GPU plans (what the driver hands the node planner)."""
    return [p.demand for p in plan_agents(cfg, on_gpu=True)]


def table1(name: str, **kw) -> AgentDemand:
    """An agent of examples/scripts/train_table1.sh: 2 policy ranks, 2 engines of TP 1 (4 GPUs), KL reference."""
    return AgentDemand(name, dp=2, engines=2, tp=1, reference=True, **kw)


def check_invariants(plan: list[AgentPlacement], demands: list[AgentDemand], nodes=NODES) -> None:
    """No node holds more bundles than GPUs; every DeepSpeed group and every TP engine on one node."""
    used = {n.node_id: 0 for n in nodes}
    for placement, demand in zip(plan, demands):
        assert len(placement.policy) == demand.policy_bundles and len(placement.engines) == demand.engine_bundles
        assert len(set(placement.policy)) == 1, placement
        for i in range(demand.engines if not demand.colocated else 0):
            assert len(set(placement.engine_nodes(i))) == 1, (placement, i)
        for node in placement.policy + placement.engines:
            used[node] += 1
    assert all(used[n.node_id] <= n.gpus for n in nodes), used


def on(placement: AgentPlacement) -> set[str]:
    return set(placement.policy + placement.engines)


def test_table1_two_agents_one_node_each():
    demands = [table1("qwen"), table1("llama")]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    # both need 4; the first takes the tie by address (A), the second the node with more free GPUs (B)
    assert on(plan[0]) == {A.node_id} and on(plan[1]) == {B.node_id}
    assert all(cross_node_sync_bytes(p, 4_022_468_096) == 0 for p in plan)


def test_table1_three_agents_third_goes_to_lower_address_on_a_tie():
    demands = [table1("a"), table1("b"), table1("c")]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    assert [on(p) for p in plan] == [{A.node_id}, {B.node_id}, {A.node_id}]


def test_dp4_four_engines_each_agent_owns_a_node():
    # the layout where, unplanned, both policies landed on one node and both engine sets on the other
    demands = [AgentDemand("x", dp=4, engines=4, reference=True), AgentDemand("y", dp=4, engines=4, reference=True)]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    assert plan[0].policy == (A.node_id,) * 4 and plan[0].engines == (A.node_id,) * 4
    assert plan[1].policy == (B.node_id,) * 4 and plan[1].engines == (B.node_id,) * 4


def test_larger_layout_two_8gpu_agents_with_tp2_engines():
    demands = [AgentDemand("q8a", dp=4, engines=2, tp=2), AgentDemand("q8b", dp=4, engines=2, tp=2)]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    assert [on(p) for p in plan] == [{A.node_id}, {B.node_id}]


def test_larger_layout_three_agents_largest_first():
    small = table1("small")
    big = AgentDemand("big", dp=4, engines=1, tp=2)  # 6 GPUs
    mid = table1("mid")
    demands = [small, big, mid]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    # big first (6) -> A (tie by address); small (4, earlier in agent order than mid) -> B (8 free vs 2);
    # mid (4) -> B (4 free vs 2)
    assert [on(p) for p in plan] == [{B.node_id}, {A.node_id}, {B.node_id}]


def test_agent_larger_than_a_node_keeps_policy_and_each_engine_whole():
    demand = AgentDemand("huge", dp=8, engines=2, tp=2)  # 12 GPUs
    plan = plan_nodes(NODES, [demand])
    check_invariants(plan, [demand])
    assert plan[0].policy == (A.node_id,) * 8 and plan[0].engines == (B.node_id,) * 4
    # every engine shard receives the full bf16 weights across nodes: 4 shards x 8,190,735,360 x 2 bytes
    assert cross_node_sync_bytes(plan[0], 8_190_735_360) == 4 * 8_190_735_360 * 2


def test_tp_engine_never_straddles_when_no_node_has_room_for_the_whole_agent():
    demands = [AgentDemand("a", dp=3, engines=1, tp=2), AgentDemand("b", dp=3, engines=1, tp=2),
               AgentDemand("c", dp=2, engines=1, tp=2)]
    plan = plan_nodes(NODES, demands)
    check_invariants(plan, demands)
    # a -> A, b -> B (3 free each); c fits on neither: policy on A (tie), its TP-2 engine cannot join it (1 free) and
    # goes whole to B
    assert plan[2].policy == (A.node_id,) * 2 and plan[2].engines == (B.node_id,) * 2
    assert cross_node_sync_bytes(plan[2], 1000) == 2 * 1000 * 2


def test_colocated_group_refused_across_nodes_unless_allowed():
    demands = [AgentDemand(n, dp=5, engines=5, colocated=True) for n in ("a", "b", "c")]
    with pytest.raises(PlacementError) as err:
        plan_nodes(NODES, demands)
    text = str(err.value)
    assert "agent 'c'" in text and "5 GPU bundle(s) on one node" in text
    assert "10.0.0.1 (aa11aa11): 3 of 8 GPUs free" in text and "10.0.0.2 (bb22bb22): 3 of 8 GPUs free" in text
    assert "--allow_straddle" in text
    plan = plan_nodes(NODES, demands, allow_straddle=True)
    assert plan[2].policy == (A.node_id,) * 3 + (B.node_id,) * 2 and plan[2].engines == ()


def test_refusal_when_total_gpus_run_out_names_the_agent_and_its_needs():
    demands = [AgentDemand(n, dp=4, engines=1, tp=4) for n in ("a", "b", "c")]
    with pytest.raises(PlacementError, match=r"agent 'c' cannot be placed on any node: it needs 4 GPU bundle\(s\) "
                                             r"on one node for its policy \(4 DeepSpeed rank\(s\)\) and 1 engine\(s\) "
                                             r"of 4 GPU\(s\) each on one node \(8 GPUs in all\)"):
        plan_nodes(NODES, demands)


@pytest.mark.parametrize("pin, node", [("10.0.0.1", A), ("nodeA", A), ("node:10.0.0.2", B), ("zone=b", B),
                                       ("bb22" * 8, B)])
def test_pin_by_address_resource_label_or_id(pin, node):
    demands = [table1("free"), table1("pinned", node=pin)]
    plan = plan_nodes(NODES, demands)
    other = B if node is A else A
    # the pinned agent is placed first; the free one then takes the node with more free GPUs
    assert on(plan[1]) == {node.node_id} and on(plan[0]) == {other.node_id}


def test_pins_fill_a_node_in_agent_order():
    demands = [table1("p1", node="nodeB"), table1("p2", node="nodeB"), table1("free")]
    plan = plan_nodes(NODES, demands)
    assert [on(p) for p in plan] == [{B.node_id}, {B.node_id}, {A.node_id}]


def test_pin_errors_name_the_agent_and_nodes():
    with pytest.raises(PlacementError, match=r"agent 'x': node='nodeC' matches no node .*10\.0\.0\.1 \(aa11aa11\): "
                                             r"node:10\.0\.0\.1, nodeA, zone=a"):
        plan_nodes(NODES, [table1("x", node="nodeC")])
    twins = [ClusterNode("n1" * 16, "127.0.0.1", 8), ClusterNode("n2" * 16, "127.0.0.1", 8)]
    with pytest.raises(PlacementError, match=r"agent 'x': node='127.0.0.1' matches 2 nodes"):
        plan_nodes(twins, [table1("x", node="127.0.0.1")])
    with pytest.raises(PlacementError, match=r"agent 'x' cannot be placed on its pinned node: .*10\.0\.0\.1 "
                                             r"\(aa11aa11\): 8 of 8 GPUs free"):
        plan_nodes(NODES, [AgentDemand("x", dp=4, engines=3, tp=2, node="nodeA")])


def test_plan_does_not_depend_on_node_listing_order():
    c = ClusterNode("cc33" * 8, "10.0.0.3", 4)
    nodes = [A, B, c]
    demands = [table1("a"), AgentDemand("b", dp=4, engines=1, tp=2), table1("c"), AgentDemand("d", dp=1, engines=1)]
    plans = {tuple(plan_nodes(list(order), demands)) for order in itertools.permutations(nodes)}
    assert len(plans) == 1
    (plan,) = plans
    check_invariants(list(plan), demands, nodes)
    # b (6) -> A; a (4) -> B; c (4) -> B (4 left) ties C (4) -> B by address; d (2) -> C
    assert [on(p) for p in plan] == [{B.node_id}, {A.node_id}, {B.node_id}, {c.node_id}]


def test_nodes_from_ray_keeps_alive_nodes_and_their_names():
    entries = [
        {"NodeID": "h" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.1",
         "Resources": {"CPU": 8.0, "GPU": 8.0, "memory": 1e9, "object_store_memory": 1e9, "node:10.0.0.1": 1.0,
                       "node:__internal_head__": 1.0, "nodeA": 1.0, "accelerator_type:H100": 1.0},
         "Labels": {"ray.io/node-id": "h" * 56}},
        {"NodeID": "d" * 56, "Alive": False, "NodeManagerAddress": "10.0.0.9", "Resources": {"GPU": 8.0}},
    ]
    (node,) = nodes_from_ray(entries)
    assert (node.node_id, node.address, node.gpus, node.cpus) == ("h" * 56, "10.0.0.1", 8, 8.0)
    assert node.names == {"node:10.0.0.1", "node:__internal_head__", "nodeA", "ray.io/node-id=" + "h" * 56}


def _cfg(agents, **kw) -> TrainConfig:
    defaults = dict(prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=6, n_samples_per_prompt=2,
                    train_batch_size=12, micro_train_batch_size=1, prompt_max_len=64, generate_max_len=32)
    defaults.update(kw)
    return TrainConfig.of(agents=agents, **defaults)


def test_preflight_demands_follow_the_run_settings_and_refuse_what_no_node_holds():
    agents = [AgentConfig(name="q", pretrain="/m/q", dp_size=2, vllm_num_engines=2, node="nodeB"),
              AgentConfig(name="l", pretrain="/m/l", dp_size=6, vllm_num_engines=1, vllm_tensor_parallel_size=2)]
    cfg = _cfg(agents)  # the default loss has a KL term: a reference per agent
    assert planned_demands(cfg) == [AgentDemand("q", dp=2, engines=2, tp=1, reference=True, node="nodeB"),
                                    AgentDemand("l", dp=6, engines=1, tp=2, reference=True)]
    plan = check_node_placement(plan_agents(cfg, on_gpu=True), NODES)  # q pinned to B; l (8) fills A
    assert [on(p.nodes) for p in plan] == [{B.node_id}, {A.node_id}]
    cfg.engines.colocate_all_models = True
    assert [d.gpus for d in planned_demands(cfg)] == [2, 6]
    cfg.engines.colocate_all_models = False
    cfg.rollout.rollout_backend = "hf"  # no engines: dp only
    assert [d.gpus for d in planned_demands(cfg)] == [2, 6]
    cfg.rollout.rollout_backend = "vllm"
    # 6 policy GPUs fit A, one TP-4 engine fits B (4 free), the second fits nowhere
    cfg.agents[1] = AgentConfig(name="l", pretrain="/m/l", dp_size=6, vllm_num_engines=2, vllm_tensor_parallel_size=4)
    cfg.validate()  # the agents resolved again
    with pytest.raises(ValueError, match=r"agent 'l' cannot be placed on any node: it needs 6 GPU bundle\(s\) .*"
                                         r"10\.0\.0\.2 \(bb22bb22\): 4 of 8 GPUs free"):
        check_node_placement(plan_agents(cfg, on_gpu=True), NODES)
