"""The node plan holds in Ray: a two-node local cluster (``ray.cluster_utils.Cluster``, 8 fake GPUs and 8 CPUs per
node), three agents' bundles as placement groups pinned by the plan, one trivial task per bundle reporting where it
runs (tasks run one after another, so each node starts one worker process and reuses it), plus one actor asked where
it sits the way the trainer asks its workers. Every probe must sit on the node the plan gave its bundle, no GPU id is
handed out twice on a node, the pinned agent sits on the node of its custom resource, and a driver that joined the
cluster is not one that started it.

The cluster writes its address under its own ``RAY_TMPDIR``, so no other Ray driver on the machine auto-connects to
it; it is stopped through its own process handles (never ``ray stop``, which kills every Ray process on the
machine)."""
from __future__ import annotations

import shutil
import tempfile
from collections import Counter

import pytest

from openrlhf_hacpo.engines.node_plan import AgentDemand, nodes_from_ray, plan_nodes
from openrlhf_hacpo.engines.placement import actor_locations, gpu_bundle_group, wait_placement_group
from openrlhf_hacpo.utils.network import driver_started_ray

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_nodes(monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="hn", dir="/tmp")  # short: Ray's socket paths live under it
    monkeypatch.setenv("RAY_TMPDIR", temp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    no_prestart = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}  # 2 cores: start few
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=8, num_gpus=8, resources={"nodeA": 1}, include_dashboard=False,
        object_store_memory=80 * 1024 * 1024, _system_config=no_prestart))
    try:
        cluster.add_node(num_cpus=8, num_gpus=8, resources={"nodeB": 1}, object_store_memory=80 * 1024 * 1024)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_planned_bundles_land_on_their_nodes(two_nodes):
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0, num_gpus=1, max_calls=0)  # GPU tasks default to a fresh worker per call
    def probe() -> dict:
        return {"node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    @ray.remote
    class Probe:
        pass

    assert not driver_started_ray()  # joined by address: ranks must meet on node addresses, not loopback
    nodes = nodes_from_ray(ray.nodes())
    assert sorted(n.gpus for n in nodes) == [8, 8]
    node_b = next(n for n in nodes if "nodeB" in n.names)
    demands = [AgentDemand("qwen", dp=2, engines=2, tp=1, reference=True),
               AgentDemand("llama", dp=2, engines=1, tp=2, node="nodeB"),
               AgentDemand("big", dp=4, engines=1, tp=2)]
    plan = plan_nodes(nodes, demands)
    assert set(plan[1].nodes) == {node_b.node_id}
    groups, gpus_taken = [], Counter()
    try:
        for placement in plan:
            for role, bundle_nodes in (("policy", placement.policy), ("engines", placement.engines)):
                group = gpu_bundle_group(len(bundle_nodes), bundle_nodes)
                groups.append(group)
                wait_placement_group(group, 30, f"agent {placement.agent!r} {role}")
                where = [ray.get(probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=i)).remote(), timeout=60)
                    for i in range(len(bundle_nodes))]
                assert [w["node_id"] for w in where] == list(bundle_nodes), (placement.agent, role)
                gpus_taken.update((w["node_id"], g) for w in where for g in w["gpu_ids"])
        assert sum(gpus_taken.values()) == sum(d.gpus for d in demands) == 14
        assert max(gpus_taken.values()) == 1  # no GPU of a node handed out twice
        actor = Probe.options(num_cpus=0, num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=groups[2], placement_group_bundle_index=1)).remote()  # llama's policy rank 1
        (where,) = actor_locations([actor], timeout_s=60)
        assert where["node_id"] == node_b.node_id and len(where["gpu_ids"]) == 1
        ray.kill(actor)
    finally:
        for group in groups:
            remove_placement_group(group)
