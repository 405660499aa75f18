"""A private Ray cluster of several raylets on this machine, started with ``ray start`` (the commands of
docs/multinode.md) for multi-node tests and benchmarks.

Each raylet is a Ray node of its own (its own node id, resources and worker processes), so placement, pinning, the
rendezvous of a DeepSpeed group and the loss of a node behave as on a cluster of machines. Every node gets flags that
keep the cluster private: its own temp dir under ``root`` (the cluster's address file lands there, so no other driver
on the machine joins it by ``ray.init()``), ports picked free for each Ray server, a worker-port range of its own and
a small object store. Token authentication is on (``RAY_AUTH_MODE=token``), as Ray 2.60 requires for a ``ray start``
cluster.

The cluster is stopped through its own processes (those whose command line names ``root``, and their children, which
include the worker processes): never ``ray stop``, which stops every Ray process on the machine.

    cluster = LocalCluster(Path("/tmp/mc1"))
    cluster.start("a", ["--head", "--port", str(cluster.port), "--num-gpus", "8", "--resources", '{"nodeA": 1}'])
    cluster.start("b", ["--address", cluster.address, "--num-gpus", "8", "--resources", '{"nodeB": 1}'])
    ...
    cluster.kill_node("b")   # SIGKILL its raylet and its processes, as when its machine is lost
    cluster.stop()
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["LocalCluster", "ray_executable"]

OBJECT_STORE_BYTES = 80 * 1024 * 1024
"""Object store of each raylet: the tiny runs move a few MB."""

WORKER_PORTS_PER_NODE = 100


def ray_executable() -> str:
    """The ``ray`` command of this Python's environment."""
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _ports_free(first: int, count: int) -> bool:
    for port in range(first, first + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
    return True


def _worker_port_range() -> tuple[int, int]:
    """A block of worker ports below Linux's ephemeral range (32768-60999), free right now."""
    for _ in range(50):
        first = random.randrange(20000, 32000 - WORKER_PORTS_PER_NODE)
        if _ports_free(first, WORKER_PORTS_PER_NODE):
            return first, first + WORKER_PORTS_PER_NODE - 1
    raise RuntimeError("no free block of worker ports between 20000 and 32000")


class LocalCluster:
    """Raylets on this machine forming one private cluster (see the module docstring).

    Args:
        root: a short, empty folder (Ray's socket paths live under it); each node's temp dir is ``root/<name>``.
        env: extra environment of the raylets and of every process they start (worker processes inherit it).
    """

    def __init__(self, root: Path, env: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **(env or {}), "RAY_TMPDIR": str(self.root), "RAY_AUTH_MODE": "token",
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.port = _free_port()
        self.nodes: dict[str, Path] = {}
        self.commands: list[list[str]] = []

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` of the head's GCS."""
        return f"127.0.0.1:{self.port}"

    def private_flags(self, name: str, head: bool) -> list[str]:
        """Flags added to a node's ``ray start``: its temp dir, free ports for each server, its worker ports, a
        small object store."""
        low, high = _worker_port_range()
        flags = ["--temp-dir", str(self.root / name), "--node-manager-port", str(_free_port()),
                 "--object-manager-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
                 "--dashboard-agent-grpc-port", str(_free_port()), "--runtime-env-agent-port", str(_free_port()),
                 "--metrics-export-port", str(_free_port()), "--min-worker-port", str(low),
                 "--max-worker-port", str(high), "--object-store-memory", str(OBJECT_STORE_BYTES)]
        if head:
            flags += ["--ray-client-server-port", str(_free_port())]
        return flags

    def start(self, name: str, args: Sequence[str], extra: Sequence[str] = (), timeout_s: float = 180.0,
              attempts: int = 2) -> float:
        """``ray start ARGS EXTRA`` plus :meth:`private_flags` as node ``name``; returns the seconds it took. A start
        that fails (Ray gives up on a raylet that does not register in time on a loaded machine) is cleaned up and
        tried again with fresh ports, ``attempts`` times in all; then ``RuntimeError`` with Ray's output."""
        head = "--head" in args
        self.nodes[name] = self.root / name
        t0 = time.perf_counter()
        for attempt in range(1, attempts + 1):
            command = [ray_executable(), "start", *args, *extra, *self.private_flags(name, head)]
            self.commands.append(command)
            done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode == 0:
                return time.perf_counter() - t0
            self._kill(self._own_processes(self.nodes[name]))
            if attempt == attempts:
                raise RuntimeError(f"ray start of node {name!r} failed ({done.returncode}, {attempts} attempts): "
                                   f"{' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------------------------ processes
    def _own_processes(self, folder: Path) -> list:
        """Processes whose command line names ``folder``, and all their descendants."""
        import psutil

        marker = str(folder)
        found: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(marker in part for part in proc.info["cmdline"] or ()):
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return list(found.values())

    def raylet_pids(self, name: str) -> list[int]:
        """Pids of node ``name``'s raylet (normally one)."""
        import psutil

        pids = []
        for proc in self._own_processes(self.nodes[name]):
            try:
                if proc.name() == "raylet" or any(part.endswith("/raylet") for part in proc.cmdline()[:1]):
                    pids.append(proc.pid)
            except psutil.NoSuchProcess:
                continue
        return pids

    def kill_node(self, name: str) -> list[int]:
        """SIGKILL node ``name`` as when its machine is lost: its raylet first, then every other process of the node
        (worker processes, agents); returns the pids killed."""
        import psutil

        raylets = self.raylet_pids(name)
        if not raylets:
            raise RuntimeError(f"node {name!r} has no raylet running under {self.nodes[name]}")
        rest = [p for p in self._own_processes(self.nodes[name]) if p.pid not in raylets]
        killed = []
        for pid in [*raylets, *(p.pid for p in rest)]:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        psutil.wait_procs([p for p in rest if p.is_running()], timeout=5)
        return killed

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process of the cluster, then SIGKILL those left after ``grace_s``."""
        self._kill(self._own_processes(self.root), grace_s)

    @staticmethod
    def _kill(procs: Sequence, grace_s: float = 5.0) -> None:
        import psutil

        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
