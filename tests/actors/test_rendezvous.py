"""An agent's process group meets on rank 0's store, listening from the moment its port is announced
(:func:`~openrlhf_hacpo.actors.deepspeed_setup.listening_store`): no other process can take the port in between, as
one did when a port found free was bound only later (an e2e run failed with ``EADDRINUSE`` on a busy machine)."""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from openrlhf_hacpo.actors.deepspeed_setup import binds_cuda_device, listening_store

REPO = Path(__file__).resolve().parents[2]


def test_the_announced_port_is_held_from_the_start():
    store = listening_store("127.0.0.1", 2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", store.port))
    assert taken.value.errno == errno.EADDRINUSE
    client = dist.TCPStore("127.0.0.1", store.port, 2, is_master=False)
    client.set("seen", "yes")
    assert store.get("seen") == b"yes"


RANK = """
import sys
import torch
from openrlhf_hacpo.actors.deepspeed_setup import init_agent_process_group, listening_store
from openrlhf_hacpo.cli.train_hacpo import build_config
cfg = build_config(["--prompt_data", "x.jsonl", "--agent", "name=a,pretrain=x", "--no_ray"])
rank, port = int(sys.argv[1]), (int(sys.argv[2]) if len(sys.argv) > 2 else None)
store = None
if rank == 0:
    store = listening_store("127.0.0.1", 2)
    print("port", store.port, flush=True)  # announced before rank 0 joins, as get_master_addr_port does
init_agent_process_group(cfg, cfg.resolved_agents[0], rank, 2, "127.0.0.1", port, torch.device("cpu"), store=store)
value = torch.tensor([float(rank + 1)])
torch.distributed.all_reduce(value)
print("sum", int(value.item()), flush=True)
"""


@pytest.mark.integration  # two processes, each joining the group through DeepSpeed
def test_two_ranks_meet_on_the_announced_store(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "rank0.err", "w") as err:
        first = subprocess.Popen([sys.executable, "-c", RANK, "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=err, text=True)
        try:
            line = ""
            while not line.startswith("port "):  # DeepSpeed writes its own lines to stdout too
                line = first.stdout.readline()
                assert line, "rank 0 ended before announcing its port: " + (tmp_path / "rank0.err").read_text()[-3000:]
            second = subprocess.run([sys.executable, "-c", RANK, "1", line.split()[1]], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=240)
            out = first.communicate(timeout=240)[0]
        finally:
            first.kill()
    assert second.returncode == 0, second.stderr[-3000:]
    assert first.returncode == 0, (tmp_path / "rank0.err").read_text()[-3000:]
    assert "sum 3" in out and "sum 3" in second.stdout  # 1 + 2 over both ranks


@pytest.mark.parametrize("version, device, bound", [("2.13.0", "cuda", True), ("2.7.1", "cuda", True),
                                                    ("2.6.5", "cuda", False), ("2.6.0", "cuda", True),
                                                    ("2.13.0", "cpu", False)])
def test_the_group_binds_the_cuda_device_where_deepspeed_would(monkeypatch, version, device, bound):
    import torch

    monkeypatch.setattr(torch, "__version__", version)
    assert binds_cuda_device(torch.device(device)) is bound
