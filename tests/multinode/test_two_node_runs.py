"""Real tiny training across two Ray nodes, and every command of docs/multinode.md run.

One cluster for the module, started by the page's own ``ray start`` commands (the head with resource ``nodeA``, the
other node with ``nodeB``, 8 fake GPUs each) as two raylets on this machine; the test adds flags that keep the
cluster private (temp dirs, ports: ``benchmarks/local_cluster.py``) and gives each raylet 8 CPUs (logical: the
machine's cores are shared by both). The runs train the tiny main job's agents (the shipped llamaS and qwenM, its
3-digit addition task and reward; ``benchmarks/two_node_compare.py``'s flags: 16 rows per learner, 2 steps, a joint
checkpoint after each) with the page's CPU launch commands, llama pinned to nodeA and qwen's two DeepSpeed ranks to
nodeB:

* joined by ``--ray_address``: every worker on its planned node, qwen's group meeting on node B's address;
* joined by ``RAY_ADDRESS``: node B is lost after step 1's checkpoint (its raylet and processes killed), the run stops
  with exit status 2 naming the agent; node B comes back (the page's join command again) and ``--resume`` finishes
  the run with every non-timing metric equal to the ``--ray_address`` run's;
* the same flags and seed on one node (a local Ray the driver starts, no pins): every non-timing metric equal to the
  two-node run's within rtol 1e-5 / atol 1e-6 (``benchmarks/two_node_compare.py`` prints the same comparison).

The page's GPU-only launch (vLLM engines need CUDA) is parsed and planned against the cluster's fake GPUs, and three
agents' planned GPU bundles are placed as pinned placement groups and probed for where they run.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import doc_commands as doc

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from compare_runs import compare, load  # noqa: E402
from local_cluster import LocalCluster  # noqa: E402
from two_node_compare import ATOL, RTOL, agents_flags, run_env, tiny_flags, zoo_inputs  # noqa: E402

pytestmark = pytest.mark.e2e

STEPS = 2
RAYLET_CPUS = ["--num-cpus", "8"]
RAN: list[str] = []
"""Roles (:data:`doc_commands.ROLES`) of the page's commands run so far, in order."""


class Cluster:
    """The module's cluster, the placeholder values of the page for it, and the run inputs."""

    def __init__(self, local: LocalCluster, agents: dict, data: dict, runs: Path) -> None:
        self.local, self.agents, self.data, self.runs = local, agents, data, runs
        self.values = {doc.HEAD_ADDRESS: local.address, doc.HEAD_ADDRESS.split(":")[1]: str(local.port),
                       "10.0.0.1": "127.0.0.1", "10.0.0.2": "127.0.0.1"}

    def start_node(self, role: str, name: str) -> None:
        cmd = doc.command(role)
        argv = doc.substitute(cmd.argv, self.values)
        assert argv[:2] == ["ray", "start"]
        self.local.start(name, argv[2:], extra=RAYLET_CPUS)
        RAN.append(role)

    def train_command(self, role: str, folder: Path) -> tuple[list[str], dict[str, str]]:
        """The page's training command of ``role`` for this cluster, saving to ``folder``: argv and environment."""
        cmd = doc.command(role)
        values = {**self.values, "/models/llama": str(self.agents["llama"]), "/models/qwen": str(self.agents["qwen"]),
                  "/data/train.jsonl": str(self.data["train"]), "/shared/runs/cpu": str(folder)}
        argv = doc.substitute(cmd.argv, values, tiny_flags(STEPS))
        assert argv[:3] == ["python", "-m", "openrlhf_hacpo.cli.train_hacpo"]
        env = {**self.local.env, **{k: doc.substitute([v], values)[0] for k, v in cmd.env.items()}}
        return [sys.executable, *argv[1:]], env

    def nodes(self) -> dict[str, object]:
        """The alive nodes by their custom resource (``nodeA``, ``nodeB``)."""
        import ray

        from openrlhf_hacpo.engines.node_plan import nodes_from_ray

        out = {}
        for node in nodes_from_ray(ray.nodes()):
            for name in ("nodeA", "nodeB"):
                if name in node.names:
                    assert name not in out, f"two alive nodes carry {name}"
                    out[name] = node
        return out


def _reread_auth_mode() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` again: it reads its settings once, when first imported."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The page's cluster; this test process joins it as a driver too (to read ``ray.nodes()`` and probe bundles)."""
    import ray

    root = Path(tempfile.mkdtemp(prefix="mn", dir="/tmp"))  # short: Ray's socket paths live under it
    local = LocalCluster(root, env=run_env())
    agents, data = zoo_inputs(tmp_path_factory.mktemp("data"))
    made = Cluster(local, agents, data, tmp_path_factory.mktemp("runs"))
    try:
        made.start_node("start head", "a")
        made.start_node("join node", "b")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_AUTH_MODE", "token")
            patch.delenv("RAY_ADDRESS", raising=False)
            _reread_auth_mode()
            try:
                ray.init(address=local.address, log_to_driver=False)
                yield made
            finally:
                ray.shutdown()
        _reread_auth_mode()  # back to this session's setting for the tests after this module
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run(argv, env, timeout_s=240) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def _rank_nodes(folder: Path, agent: str) -> list[str]:
    return [p["node_id"] for p in json.loads((folder / "placement.json").read_text())[agent]["policy"]]


def _assert_same_metrics(reference: Path, other: Path, what: str) -> None:
    problems, worst, compared = compare(load(str(reference)), load(str(other)), RTOL, ATOL)
    assert compared > 100 and not problems, (what, worst, problems[:10])


@pytest.fixture(scope="module")
def two_node_run(cluster):
    """The page's ``--ray_address`` CPU launch, run to the end."""
    folder = cluster.runs / "ray_address"
    argv, env = cluster.train_command("train by --ray_address", folder)
    done = _run(argv, env)
    RAN.append("train by --ray_address")
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


def test_pinned_cpu_run_places_each_agent_on_its_node_and_meets_on_the_node_address(cluster, two_node_run):
    nodes = cluster.nodes()
    placement = json.loads((two_node_run / "placement.json").read_text())
    assert _rank_nodes(two_node_run, "llama") == [nodes["nodeA"].node_id]
    assert _rank_nodes(two_node_run, "qwen") == [nodes["nodeB"].node_id] * 2
    # joined a cluster: the group meets on rank 0's node address (Ray gives a raylet started with 127.0.0.1 the
    # machine's address), which every rank of the agent reports as its own
    meet = placement["qwen"]["rendezvous"]
    assert meet["address"] == nodes["nodeB"].address == placement["qwen"]["policy"][0]["address"]
    assert placement["llama"]["rendezvous"] is None  # one rank: no group to meet
    records = [json.loads(line) for line in (two_node_run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["agent"]) for r in records] == [(s, a) for s in range(1, STEPS + 1)
                                                          for a in ("llama", "qwen")]
    assert any(r["loss"] != 0 for r in records), "no learning signal: every advantage was zero"


def test_the_gpu_launch_plans_on_the_clusters_fake_gpus_and_a_cpu_layout_too_large_is_refused(cluster):
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.engines.node_plan import AgentDemand, PlacementError, plan_nodes
    from openrlhf_hacpo.trainer.preflight import check_node_placement

    nodes = cluster.nodes()
    (cmd,) = doc.commands("gpu-only")
    values = {**cluster.values, "/models/Qwen3-4B-Base": "/m/qwen", "/models/Llama-3.2-3B-Instruct": "/m/llama",
              "/data/train.jsonl": "train.jsonl", "/shared/runs/table1": "/tmp/table1"}
    cfg = build_config(doc.substitute(cmd.argv, values, tiny_flags(STEPS, backend=None))[3:])
    assert sorted(n.gpus for n in nodes.values()) == [8, 8]
    qwen, llama = (p.nodes for p in check_node_placement(plan_agents(cfg, on_gpu=True), list(nodes.values())))
    assert set(qwen.nodes) == {nodes["nodeA"].node_id} and set(llama.nodes) == {nodes["nodeB"].node_id}
    assert len(qwen.policy + qwen.engines) == 4
    # CPU bundles: the raylets offer the 8 CPUs they were started with; 9 ranks pinned to one of them are refused
    with pytest.raises(PlacementError, match=r"agent 'qwen' cannot be placed on its pinned node: it needs 9 CPU "
                                             r"bundle\(s\) on one node .* 8 of 8 CPUs free; .* 8 of 8 CPUs free"):
        plan_nodes(list(nodes.values()), [AgentDemand("qwen", dp=9, node="nodeB")], kind="CPU")


def test_planned_gpu_bundles_land_on_their_nodes(cluster):
    """Three agents' GPU bundles as placement groups pinned by the plan, one trivial task per bundle reporting where
    it runs, and one actor asked where it sits the way the trainer asks its workers: every probe on the node the plan
    gave its bundle, no GPU id handed out twice on a node, the pinned agent on the node of its custom resource, and
    this driver (joined by address) not the one that started Ray."""
    from collections import Counter

    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from openrlhf_hacpo.engines.node_plan import AgentDemand, plan_nodes
    from openrlhf_hacpo.engines.placement import actor_locations, bundle_group, wait_placement_group
    from openrlhf_hacpo.utils.network import driver_started_ray

    @ray.remote(num_cpus=0, num_gpus=1, max_calls=0)  # GPU tasks default to a fresh worker per call
    def probe() -> dict:
        return {"node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    @ray.remote
    class Probe:
        pass

    assert not driver_started_ray()  # joined by address: ranks must meet on node addresses, not loopback
    nodes = cluster.nodes()
    demands = [AgentDemand("qwen", dp=2, engines=2, tp=1, reference=True),
               AgentDemand("llama", dp=2, engines=1, tp=2, node="nodeB"),
               AgentDemand("big", dp=4, engines=1, tp=2)]
    plan = plan_nodes(list(nodes.values()), demands)
    assert set(plan[1].nodes) == {nodes["nodeB"].node_id}
    groups, gpus_taken = [], Counter()
    try:
        for placement in plan:
            for role, bundle_nodes in (("policy", placement.policy), ("engines", placement.engines)):
                group = bundle_group(len(bundle_nodes), bundle_nodes)
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
        assert where["node_id"] == nodes["nodeB"].node_id and len(where["gpu_ids"]) == 1
        ray.kill(actor)
    finally:
        for group in groups:
            remove_placement_group(group)


@pytest.fixture(scope="module")
def lost_node_run(cluster):
    """The page's ``RAY_ADDRESS`` launch, node B killed once step 1's joint checkpoint is saved (and verified): the
    folder, the finished process, its stderr, its environment."""
    folder = cluster.runs / "ray_address_env"
    argv, env = cluster.train_command("train by RAY_ADDRESS", folder)
    RAN.append("train by RAY_ADDRESS")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    log = folder / "train.log"
    deadline = time.monotonic() + 300
    while not (log.is_file() and "saved joint checkpoint" in log.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the run ended ({proc.returncode}) or stalled before its first checkpoint: {err[-4000:]}")
        time.sleep(0.1)
    cluster.local.kill_node("b")
    _, err = proc.communicate(timeout=300)
    return folder, proc, err, env


def test_losing_a_node_stops_the_run_with_exit_2_naming_agent_worker_node_and_resume(cluster, lost_node_run):
    import re

    folder, proc, err, _ = lost_node_run
    assert proc.returncode == 2, err[-4000:]
    placement = json.loads((folder / "placement.json").read_text())
    lost = placement["qwen"]["policy"][0]["node_id"]
    message = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"train_hacpo: error: step 2 failed: agent 'qwen', (policy rank [01]|reference), node "
                        rf"\S+ \(host \S+, node {lost[:8]}\), phase [^:]+: the worker died .*\. Last complete "
                        rf"checkpoint: \S+/checkpoints/global_step1; resume with: python -m "
                        rf"openrlhf_hacpo\.cli\.train_hacpo .* --resume", message), err[-4000:]
    assert message.removeprefix("train_hacpo: ") in (folder / "train.log").read_text()
    # joined by RAY_ADDRESS: the group met on node B's address too (both raylets have this machine's address)
    meet = placement["qwen"]["rendezvous"]["address"]
    assert meet == placement["qwen"]["policy"][0]["address"] == cluster.nodes()["nodeA"].address


def test_the_node_comes_back_and_resume_repeats_the_uninterrupted_run(cluster, lost_node_run, two_node_run):
    import shlex

    import ray

    folder, _, err, env = lost_node_run
    cluster.start_node("join node", "b")
    deadline = time.monotonic() + 90
    while True:  # the lost node stays "alive" until the GCS misses its health checks
        alive = [n for n in ray.nodes() if n["Alive"] and "nodeB" in n["Resources"]]
        if len(alive) == 1:
            break
        assert time.monotonic() < deadline, f"{len(alive)} alive nodes carry nodeB"
        time.sleep(0.5)
    # the command the error line gives
    advised = shlex.split(err.strip().splitlines()[-1].split("resume with: ", 1)[1])
    assert advised[:3] == ["python", "-m", "openrlhf_hacpo.cli.train_hacpo"] and advised[-1] == "--resume"
    done = _run([sys.executable, *advised[1:]], env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "resumed from" in (folder / "train.log").read_text()
    assert _rank_nodes(folder, "qwen") == [cluster.nodes()["nodeB"].node_id] * 2  # the new node B
    _assert_same_metrics(two_node_run, folder, "resumed after losing node B")


def test_the_same_run_on_one_node_gives_the_same_metrics(cluster, two_node_run):
    folder = cluster.runs / "one_node"
    private = Path(tempfile.mkdtemp(prefix="mo", dir="/tmp"))  # no cluster to find: the driver starts its own Ray
    try:
        env = {**run_env(), "RAY_TMPDIR": str(private)}
        argv = ["--device", "cpu", *agents_flags(cluster.agents, pinned=False), "--prompt_data",
                str(cluster.data["train"]), "--save_path", str(folder), *tiny_flags(STEPS)]
        done = _run([sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo", *argv], env)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    placement = json.loads((folder / "placement.json").read_text())
    assert placement["qwen"]["rendezvous"]["address"] == "127.0.0.1"  # its own Ray: --bind_host
    _assert_same_metrics(two_node_run, folder, "one node against two")


def test_every_run_command_of_the_page_was_run(cluster, two_node_run, lost_node_run):
    assert sorted(set(RAN)) == sorted(doc.ROLES)
