"""The network surface of a single-machine run.

Ray 2.60 replaces a loopback node address by the machine's address (``services.resolve_ip_for_localhost``) and binds
its gRPC servers on all interfaces, so a local run cannot be confined to loopback from the driver; the test below
records that (strict xfail: it fails loudly once the run listens on loopback only). Ray's token authentication, on
by default in 2.60, guards those ports.
"""
from __future__ import annotations

import ipaddress

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """Ray started the way the driver starts it for a single-machine run."""
    ray = pytest.importorskip("ray")
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.controller import HACPOController

    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    save = tmp_path_factory.mktemp("run")
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--save_path", str(save),
                        "--n_samples_per_prompt", "2", "--rollout_batch_size", "2", "--train_batch_size", "4",
                        "--micro_train_batch_size", "2"])
    controller = HACPOController(cfg)
    controller.lock.acquire()
    controller.cluster.init_ray()
    yield ray
    controller.close()


@pytest.mark.xfail(strict=True, reason="Ray 2.60 binds its GCS, raylet and worker gRPC servers on all interfaces "
                                       "whatever the node address; see docs/training.md, Security")
def test_every_listening_socket_of_the_run_is_on_loopback(local_ray):
    import os

    import psutil

    me = psutil.Process(os.getpid())
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening
    public = [(c.pid, c.laddr.ip, c.laddr.port) for c in listening if not ipaddress.ip_address(c.laddr.ip).is_loopback]
    assert not public, f"listening beyond loopback: {public}"
