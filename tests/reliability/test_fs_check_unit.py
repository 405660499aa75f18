"""The shared-folder check's pure parts: which nodes host a worker, how a node is named, what each failure says;
and a run whose workers all sit on the driver's node runs no task at all."""
from __future__ import annotations

import socket

from openrlhf_hacpo.trainer.fs_check import check_shared_folders, folder_problems, node_labels, worker_node_ids

PLACEMENT = {
    "qwen": {"policy": [{"rank": 0, "node_id": "A" * 56, "address": "10.0.0.1"},
                        {"rank": 1, "node_id": "B" * 56, "address": "10.0.0.2"}],
             "reference": {"node_id": "A" * 56, "address": "10.0.0.1"},
             "engines": [{"engine": 0, "node_id": "C" * 56, "address": "10.0.0.3"}],
             "rendezvous": {"address": "10.0.0.1", "port": 29500}},
    "llama": {"policy": [{"rank": 0, "node_id": "B" * 56, "address": "10.0.0.2"}], "engines": [],
              "rendezvous": None},
}


def test_worker_nodes_in_first_seen_order():
    assert worker_node_ids(PLACEMENT) == ["A" * 56, "B" * 56, "C" * 56]
    assert worker_node_ids({}) == []


def test_node_labels_name_address_host_and_id():
    nodes = [{"NodeID": "9be0d712aa", "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "gpu-b"}]
    assert node_labels(nodes) == {"9be0d712aa": "10.0.0.2 (host gpu-b, node 9be0d712)"}


def test_each_failure_names_the_node_the_folder_and_what_failed():
    node, folder = "10.0.0.2 (host gpu-b, node 9be0d712)", "/runs/x"
    ok = {"write": None, "driver_token": "ok"}
    assert folder_problems(node, folder, ok, "ok") == []
    assert folder_problems(node, folder, {"write": "Permission denied", "driver_token": "ok"}, "missing") == [
        f"node {node} cannot write into /runs/x (Permission denied)"]
    assert folder_problems(node, folder, {"write": None, "driver_token": "missing"}, "missing") == [
        f"the driver (host {socket.gethostname()}) cannot see the file node {node} wrote into /runs/x: the folder is "
        "not shared between that node and the driver's",
        f"node {node} cannot see the file the driver wrote into /runs/x: the folder is not shared between that node "
        "and the driver's"]
    assert folder_problems(node, folder, ok, "differs") == [
        f"the driver reads the file node {node} wrote into /runs/x with other content: the folder is not one shared "
        "folder"]


def test_a_run_on_the_drivers_node_only_runs_no_task(tmp_path):
    """No Ray is needed (the tier guard would fail a unit test that started it): nothing is written either."""
    check_shared_folders([tmp_path], ["A" * 56], {}, driver_node_id="A" * 56)
    assert list(tmp_path.iterdir()) == []
