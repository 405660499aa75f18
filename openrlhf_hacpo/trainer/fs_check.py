"""The run folder is one shared folder on every node: checked at start, not assumed.

Every agent's rank 0 writes its model states and ``hf/<agent>/`` on its own node and every rank writes its
optimizer partition there, while the driver writes the trainer state, metrics and ``latest`` and reads everything
back on ``--resume``. A node that sees another folder under the same path (a node-local disk, a share not mounted
there) would leave checkpoints silently incomplete. So, once the placement plan gives every worker its node and
before any model loads (on a one-node cluster, once Ray has placed the workers), :func:`check_shared_folders` runs
one Ray task on every node that hosts a worker, other than the driver's:

1. the driver writes a token file (random content) into each folder (``--save_path`` and the checkpoint folder);
2. the task, on its node, reads the driver's token back and writes a token of its own (content checked);
3. the driver reads each node's token and compares its content.

Then every token is removed (a node's token the driver could not see by a task on that node). A node that cannot
write, or whose file the driver cannot see, or that cannot see the driver's file, stops the run with a
:class:`~openrlhf_hacpo.utils.errors.RunFolderError` naming the node (address, host, Ray node id), the folder and what
failed. A run whose workers all sit on the driver's node runs no task at all.

:func:`remove_on_nodes` runs one task per node too: it removes what a failed checkpoint save left in each node's
view of the checkpoint folder.
"""
from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from openrlhf_hacpo.utils.errors import RunFolderError

__all__ = ["FS_CHECK_TIMEOUT_S", "check_shared_folders", "folder_problems", "node_labels", "remove_on_nodes",
           "worker_node_ids"]

logger = logging.getLogger(__name__)

FS_CHECK_TIMEOUT_S = 120.0
"""How long the driver waits for a node's check task (it starts a Ray worker process on that node)."""

_TOKEN_PREFIX = ".fs_check."


def node_labels(ray_nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Node id -> ``"10.0.0.2 (host gpu-b, node 9be0d712)"``, from ``ray.nodes()``, as errors name a node."""
    labels = {}
    for node in ray_nodes:
        node_id = str(node.get("NodeID", ""))
        host = node.get("NodeManagerHostname") or "?"
        labels[node_id] = f"{node.get('NodeManagerAddress', '?')} (host {host}, node {node_id[:8]})"
    return labels


def worker_node_ids(placement: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes hosting a worker, in first-seen order, from the placement records (``<save_path>/placement.json``:
    per agent, ``policy`` ranks, ``reference`` and ``engines``, each entry with a ``node_id``)."""
    found: dict[str, None] = {}
    for roles in placement.values():
        for role in ("policy", "reference", "engines"):
            entries = roles.get(role)
            for entry in entries if isinstance(entries, list) else [entries] if entries else []:
                if entry.get("node_id"):
                    found[entry["node_id"]] = None
    return list(found)


def folder_problems(node: str, folder: str, on_node: Mapping[str, Any], driver_read: str) -> list[str]:
    """What failed for one node and one folder.

    Args:
        node: how to name the node.
        on_node: the node task's report: ``write`` (None, or why the node could not write its token) and
            ``driver_token`` (``ok``, ``missing``, ``differs`` or why it could not be read).
        driver_read: what the driver found of the node's token (``ok``, ``missing``, ``differs``, or why it could
            not be read; ignored when the node could not write).
    """
    problems = []
    if on_node.get("write"):
        problems.append(f"node {node} cannot write into {folder} ({on_node['write']})")
    elif driver_read == "missing":
        problems.append(f"the driver (host {socket.gethostname()}) cannot see the file node {node} wrote into "
                        f"{folder}: the folder is not shared between that node and the driver's")
    elif driver_read != "ok":
        problems.append(f"the driver reads the file node {node} wrote into {folder} with "
                        f"{'other content' if driver_read == 'differs' else driver_read}: the folder is not one "
                        "shared folder")
    seen = on_node.get("driver_token")
    if seen == "missing":
        problems.append(f"node {node} cannot see the file the driver wrote into {folder}: the folder is not shared "
                        "between that node and the driver's")
    elif seen not in ("ok", None):
        problems.append(f"node {node} reads the file the driver wrote into {folder} with "
                        f"{'other content' if seen == 'differs' else seen}: the folder is not one shared folder")
    return problems


def check_shared_folders(folders: Sequence[str | os.PathLike], node_ids: Sequence[str], labels: Mapping[str, str],
                         driver_node_id: str, timeout_s: float = FS_CHECK_TIMEOUT_S) -> None:
    """Prove that every node in ``node_ids`` and the driver share ``folders`` (see the module docstring).

    Raises:
        RunFolderError: a node cannot write, a file is not seen on the other side, or a node does not answer; the
            message names each node and folder at fault.
    """
    nodes = [n for n in dict.fromkeys(node_ids) if n != driver_node_id]
    if not nodes:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folders = [os.path.abspath(f) for f in dict.fromkeys(str(f) for f in folders)]
    nonce = secrets.token_hex(8)
    driver_token = f"{_TOKEN_PREFIX}driver.{nonce}"
    tokens = {node: f"{_TOKEN_PREFIX}{node[:16]}.{nonce}" for node in nodes}
    for folder in folders:
        Path(folder).mkdir(parents=True, exist_ok=True)
        _write_token(Path(folder) / driver_token, nonce)
    task = _probe_task()
    refs = {node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        folders, driver_token, tokens[node], nonce) for node in nodes}
    problems: list[str] = []
    unseen: dict[str, list[str]] = {}
    try:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        for node, ref in refs.items():
            label = labels.get(node, node[:8])
            if ref not in ready:
                problems.append(f"node {label} did not run the filesystem check within {timeout_s:g} s")
                ray.cancel(ref, force=True)
                continue
            try:
                reports = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - named with the node
                problems.append(f"the filesystem check failed on node {label}: {type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''}")
                continue
            for folder, report in zip(folders, reports):
                token = Path(folder) / tokens[node]
                seen = _read_token(token, nonce)
                if seen == "ok" or seen == "differs":
                    token.unlink(missing_ok=True)
                elif not report.get("write"):
                    unseen.setdefault(node, []).append(str(token))
                problems += folder_problems(label, folder, report, seen)
    finally:
        for folder in folders:
            (Path(folder) / driver_token).unlink(missing_ok=True)
        if unseen:
            remove_on_nodes(unseen, timeout_s=min(timeout_s, 30.0))
    if problems:
        raise RunFolderError("filesystem check: " + "; ".join(problems) + ". --save_path and the checkpoint folder "
                             "must be one folder shared by every node at the same path (docs/multinode.md, "
                             "\"Shared filesystem\")")
    logger.info("filesystem check: %d node(s) besides the driver's write into and read from %s", len(nodes),
                ", ".join(folders))


def remove_on_nodes(paths_by_node: Mapping[str, Sequence[str]], timeout_s: float = 60.0) -> None:
    """Remove files or folders in each node's own view (one task per node, ``{node id: [paths]}``); failures and
    nodes that do not answer are logged, not raised (this is cleanup)."""
    if not paths_by_node:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = _remove_task()
    refs = {node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        list(paths)) for node, paths in paths_by_node.items()}
    ready, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for node, ref in refs.items():
        if ref in pending:
            logger.warning("node %s did not remove %s within %g s", node[:8], ", ".join(paths_by_node[node]),
                           timeout_s)
            continue
        try:
            ray.get(ref)
        except Exception as err:  # noqa: BLE001 - cleanup
            logger.warning("node %s could not remove %s: %s", node[:8], ", ".join(paths_by_node[node]), err)


def _write_token(path: Path, content: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def _read_token(path: Path, content: str) -> str:
    try:
        return "ok" if path.read_text(encoding="utf-8") == content else "differs"
    except FileNotFoundError:
        return "missing"
    except (OSError, UnicodeDecodeError) as err:
        return f"an error ({getattr(err, 'strerror', None) or err})"


def _probe_folders(folders: Sequence[str], driver_token: str, token: str, nonce: str) -> list[dict[str, Any]]:
    """On a node: for each folder, read the driver's token and write this node's."""
    reports = []
    for folder in folders:
        report: dict[str, Any] = {"host": socket.gethostname(),
                                  "driver_token": _read_token(Path(folder) / driver_token, nonce), "write": None}
        if not os.path.isdir(folder):
            report["write"] = "the folder does not exist on that node"
        else:
            try:
                _write_token(Path(folder) / token, nonce)
            except OSError as err:
                report["write"] = err.strerror or str(err)
        reports.append(report)
    return reports


def _remove_paths(paths: Sequence[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


@functools.cache
def _probe_task():
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_probe_folders)


@functools.cache
def _remove_task():
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_remove_paths)
