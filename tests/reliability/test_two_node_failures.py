"""Two Ray nodes on this machine, the second in a mount namespace of its own where ``<root>/private`` is a tmpfs:
a folder node B cannot share with the driver, next to ``<root>/shared``, which both see.

* a run pinned to node B whose save path is private is refused by the filesystem check before any training, exit
  status 2, one line naming node B (address, host, node id), the folder and what failed; no token file is left on
  either side;
* a task on node B removes what a failed save left in node B's own view of a folder;
* a rank lost while its peer already failed in a collective is named as the cause (two plain actors), and an error
  of live workers is raised unchanged.

A whole node lost mid-run (exit 2, the named line in ``train.log``, then the exact resume) is tested in
``tests/multinode/test_two_node_runs.py``.

The cluster is built with ``benchmarks/local_cluster.py`` (``ray start`` with private temp dirs and ports, token
authentication) and stopped through its own processes, never ``ray stop``.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from local_cluster import LocalCluster, ray_executable  # noqa: E402

from openrlhf_hacpo.actors.pending import AgentWorkerDied, Pending  # noqa: E402

pytestmark = pytest.mark.e2e

TRAIN = [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo"]


def _env() -> dict[str, str]:
    from openrlhf_hacpo.zoo.job import trainer_env

    env = trainer_env()
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class Nodes:
    """The cluster, its two folders and node B's view of the private one."""

    def __init__(self, local: LocalCluster, shared: Path, private: Path) -> None:
        self.local, self.shared, self.private = local, shared, private

    def b_view(self, path: Path) -> Path:
        """``path`` as node B sees it (through its raylet's root)."""
        (raylet,) = self.local.raylet_pids("b")
        return Path(f"/proc/{raylet}/root") / Path(path).relative_to("/")

    def node(self, resource: str) -> dict:
        import ray

        (found,) = [n for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
        return found

    def label(self, resource: str) -> str:
        node = self.node(resource)
        return f"{node['NodeManagerAddress']} (host {node['NodeManagerHostname']}, node {node['NodeID'][:8]})"


def _reread_auth_mode() -> None:
    """Make this process's Ray read ``RAY_AUTH_MODE`` again: it reads its settings once, when first imported."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def nodes():
    import ray

    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"],
                                                         capture_output=True).returncode != 0:
        pytest.skip("needs unshare --mount (root) to give a node a folder of its own")
    root = Path(tempfile.mkdtemp(prefix="fsn", dir="/tmp"))  # short: Ray's socket paths live under it
    shared, private = root / "shared", root / "private"
    shared.mkdir()
    private.mkdir()
    local = LocalCluster(root / "ray", env=_env())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "token")
        patch.delenv("RAY_ADDRESS", raising=False)
        try:
            local.start("a", ["--head", "--port", str(local.port), "--node-ip-address", "127.0.0.1", "--num-cpus",
                              "1", "--resources", '{"nodeA": 1}', "--include-dashboard", "false",
                              "--disable-usage-stats"])
            flags = ["--address", local.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--resources",
                     '{"nodeB": 1}', *local.private_flags("b", head=False)]
            local.nodes["b"] = local.root / "b"
            script = 'mount -t tmpfs -o size=64m tmpfs "$0" && exec "$@"'
            done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                                   str(private), ray_executable(), "start", *flags], env=local.env,
                                  capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, done.stderr[-3000:]
            _reread_auth_mode()
            ray.init(address=local.address, log_to_driver=False)
            deadline = time.monotonic() + 60
            while len([n for n in ray.nodes() if n["Alive"]]) < 2:
                assert time.monotonic() < deadline, "node B did not join"
                time.sleep(0.2)
            yield Nodes(local, shared, private)
        finally:
            ray.shutdown()
            local.stop()
            shutil.rmtree(root, ignore_errors=True)
    _reread_auth_mode()  # back to this session's setting for the tests after this module


def _args(nodes: Nodes, save_path: Path, agent: str, *extra: str, tiny_agents, prompt_file, reward_file) -> list[str]:
    return [*TRAIN, "--ray_address", nodes.local.address, "--device", "cpu", "--agent", agent,
            "--prompt_data", prompt_file, "--apply_chat_template", "--reward_fn", reward_file,
            "--reward_num_workers", "0", "--n_samples_per_prompt", "4", "--rollout_batch_size", "2",
            "--train_batch_size", "8", "--micro_train_batch_size", "4", "--generate_max_len", "8",
            "--prompt_max_len", "64", "--init_kl_coef", "0", "--seed", "7", "--no_progress_bar", "--no_save_hf",
            "--save_path", str(save_path), *extra]


def test_a_private_run_folder_is_refused_naming_the_node(nodes, tiny_agents, prompt_file, reward_file):
    folder = nodes.private / "run"
    folder.mkdir()
    nodes.b_view(folder).mkdir()  # node B has a folder of that name too, but its own
    argv = _args(nodes, folder, f"name=llama,pretrain={tiny_agents['llama']},node=nodeB", "--max_steps", "1",
                 tiny_agents=tiny_agents, prompt_file=prompt_file, reward_file=reward_file)
    done = subprocess.run(argv, env=nodes.local.env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 2, done.stderr[-4000:]
    line = [text for text in done.stderr.splitlines() if text.startswith("train_hacpo: ")][-1]
    label = nodes.label("nodeB")
    assert line.startswith("train_hacpo: error: filesystem check: "), done.stderr[-4000:]
    assert (f"the driver (host {socket.gethostname()}) cannot see the file node {label} wrote into {folder}: the "
            "folder is not shared") in line
    assert f"node {label} cannot see the file the driver wrote into {folder}" in line
    assert "must be one folder shared by every node" in line
    assert not (folder / "metrics.jsonl").exists()  # refused before any training
    leftovers = [p.name for view in (folder, nodes.b_view(folder), folder / "checkpoints",
                                     nodes.b_view(folder / "checkpoints")) if view.is_dir()
                 for p in view.iterdir() if p.name.startswith(".fs_check")]
    assert leftovers == []
    assert line in (folder / "train.log").read_text().splitlines()[-1]


def test_a_task_on_each_node_removes_what_a_failed_save_left_there(nodes):
    from openrlhf_hacpo.trainer.fs_check import remove_on_nodes

    tmp = nodes.private / "checkpoints" / ".global_step2.abc.tmp"
    (nodes.b_view(tmp) / "agents" / "llama").mkdir(parents=True)
    (nodes.b_view(tmp) / "agents" / "llama" / "rng_rank0.pt").write_bytes(b"x")
    tmp.mkdir(parents=True)  # the driver's own view: the task on node B must not be the one removing this
    remove_on_nodes({nodes.node("nodeB")["NodeID"]: [str(tmp)]})
    assert not nodes.b_view(tmp).exists() and tmp.is_dir()


def _rank_class(ray):
    @ray.remote(num_cpus=0, max_restarts=0)
    class Rank:
        def train_step(self, fail: bool = False, die_after_s: float | None = None) -> str:
            if fail:
                raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41235")
            if die_after_s is not None:  # a rank whose process is lost while its peer already failed
                time.sleep(die_after_s)
                os._exit(1)
            return "done"

    return Rank


class _Group:
    """An agent group as :class:`Pending` sees it."""

    def __init__(self, policies) -> None:
        self.name, self.policies, self.reference, self.engines = "llama", policies, None, []
        self.timeout_s = 60.0
        self.worker_nodes = {policies[1]._actor_id.hex(): "10.0.0.2 (host gpu-b, node 9be0d712)"}


def test_the_dead_rank_is_named_not_its_peers_error(nodes):
    """A rank lost inside a collective: its peer's own error (gloo's "Connection reset by peer") reaches the driver
    first; the driver names the dead rank instead, adding the peer's error. Two plain actors stand in for ranks."""
    import ray

    Rank = _rank_class(ray)
    ranks = [Rank.remote(), Rank.remote()]
    group = _Group(ranks)
    ray.get([r.train_step.remote() for r in ranks])  # both up
    # rank 0 fails in the collective at once; rank 1's process is lost a moment later
    parts = [ranks[0].train_step.remote(fail=True), ranks[1].train_step.remote(die_after_s=1.0)]
    pending = Pending(group, "policy", parts, list, remote=True, method="train_step", workers=ranks)
    with pytest.raises(AgentWorkerDied) as info:
        pending.result()
    err = info.value
    assert (err.agent, err.role, err.rank, err.phase) == ("llama", "policy", 1, "update")
    assert err.node == "10.0.0.2 (host gpu-b, node 9be0d712)"
    assert "its peers then failed with RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed" in str(err)
    ray.kill(ranks[0])


def test_an_error_of_live_workers_is_raised_unchanged(nodes):
    import ray

    Rank = _rank_class(ray)
    ranks = [Rank.remote(), Rank.remote()]
    parts = [ranks[0].train_step.remote(fail=True), ranks[1].train_step.remote()]
    pending = Pending(_Group(ranks), "policy", parts, list, remote=True, method="train_step", workers=ranks)
    with pytest.raises(Exception) as info:
        pending.result()
    assert not isinstance(info.value, AgentWorkerDied) and "Connection closed by peer" in str(info.value)
    for rank in ranks:
        ray.kill(rank)
