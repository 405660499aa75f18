"""Rendezvous of an agent's process group: its address, its port, and the network interface gloo uses.

* `listening_store`: rank 0's TCP store, listening on its port before the port is announced.
* `free_port`: a TCP port free on a host right now (bound later by someone else: tests only, see
  `listening_store`).
* `rendezvous_host`: the address rank 0 announces. A run that started its own local Ray has every rank on this
  machine and meets on ``--bind_host`` (loopback by default); a run that joined a cluster (``--ray_address``,
  ``RAY_ADDRESS``, ``ray job submit``, or ``ray.init()`` finding a running ``ray start --head``) may have ranks on
  other nodes and meets on rank 0's node address.
* `gloo_interface`: the interface holding a rank's own address (``lo`` for loopback), for ``GLOO_SOCKET_IFNAME``:
  gloo's pair connections then leave through the interface the rendezvous address lives on.
* `driver_started_ray`: whether this process started the Ray instance it is connected to.
"""
from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["driver_started_ray", "free_port", "gloo_interface", "host_interfaces", "is_loopback", "listening_store",
           "rendezvous_host"]


def listening_store(host: str, world_size: int, timeout: datetime.timedelta) -> Any:
    """Rank 0's ``torch.distributed.TCPStore`` on ``host``, listening on a port the system picks while binding it
    (port 0; ``store.port`` says which) before any other rank is told the port. Nothing can take that port in
    between, which a port found free and bound later (:func:`free_port`) cannot promise on a busy machine: any
    outgoing connection may take it as its local port. The other ranks connect to ``(host, store.port)``."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (``""`` means every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rendezvous_host(started_local_ray: bool, bind_host: str, node_address: str) -> str:
    """Address rank 0 announces to its agent's other ranks: ``bind_host`` when the run started its own local Ray
    (every rank is on this machine), else rank 0's node address (``ray.util.get_node_ip_address()``)."""
    return bind_host if started_local_ray else node_address


def gloo_interface(own_address: str, interfaces: Mapping[str, Sequence[str]]) -> str | None:
    """The interface (``GLOO_SOCKET_IFNAME``) that holds ``own_address`` among ``{name: [addresses]}`` (as
    :func:`host_interfaces` gives); for a loopback address the loopback interface. None when no interface holds it
    (gloo then resolves the host name itself)."""
    if is_loopback(own_address):
        for name, addresses in sorted(interfaces.items()):
            if any(is_loopback(a) for a in addresses):
                return name
        return None
    holders = sorted(name for name, addresses in interfaces.items() if own_address in addresses)
    return holders[0] if holders else None


def host_interfaces() -> dict[str, list[str]]:
    """This host's interfaces and their IPv4/IPv6 addresses (``psutil.net_if_addrs``)."""
    import psutil

    return {name: [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
            for name, addrs in psutil.net_if_addrs().items()}


def driver_started_ray() -> bool:
    """True when this process started the Ray instance it is connected to (``ray.init()`` with no cluster to join),
    False when it joined one (an address, ``RAY_ADDRESS``, a job submitted to a cluster, or ``ray.init()`` finding a
    running ``ray start --head``) or Ray is not initialised."""
    import ray

    if not ray.is_initialized():
        return False
    node = getattr(ray._private.worker, "_global_node", None)  # the driver's node: head=True when it started Ray
    return bool(node is not None and getattr(node, "head", False))
