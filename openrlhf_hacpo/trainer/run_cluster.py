"""The Ray side of a run, for the controller: :class:`RunCluster` starts or joins Ray, decides the device, plans the
agents once (:func:`~openrlhf_hacpo.actors.agent_plan.plan_agents`, then the node of every bundle on a multi-node
cluster), records where the workers landed (``<save_path>/placement.json``) and which node each one runs on (for
errors), and proves that the workers' nodes share the run folder.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors.agent_plan import AgentPlan, plan_agents
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.node_plan import PLACEMENT_FILE, nodes_from_ray
from openrlhf_hacpo.trainer.fs_check import (FS_CHECK_TIMEOUT_S, check_shared_folders, node_labels, remove_on_nodes,
                                             worker_node_ids)
from openrlhf_hacpo.trainer.preflight import check_node_placement, run_gpu_stack_preflight
from openrlhf_hacpo.trainer.run_folder import RunLock
from openrlhf_hacpo.utils.atomic import atomic_write_json
from openrlhf_hacpo.utils.network import driver_started_ray
from openrlhf_hacpo.utils.shutdown import keep_signal_handlers

__all__ = ["RunCluster"]

logger = logging.getLogger(__name__)


class RunCluster:
    """Ray, the device and where one run's workers go.

    Attributes:
        started_ray: this driver started the Ray instance (:meth:`shutdown` stops it).
        started_local_ray: this process started the Ray instance the run uses (ranks then meet on ``--bind_host``),
            as opposed to joining a cluster by any route (:func:`~openrlhf_hacpo.utils.network.driver_started_ray`).
        placement: where every agent's workers landed (:meth:`record_placement`), ``{}`` until then and without Ray.
        node_labels: node id -> "address (host, node id)", for errors naming a node.
    """

    def __init__(self, cfg: TrainConfig, lock: RunLock) -> None:
        self.cfg = cfg
        self.lock = lock
        self.started_ray = False
        self.started_local_ray = False
        self.placement: dict[str, Any] = {}
        self.node_labels: dict[str, str] = {}

    # ------------------------------------------------------------------------------------------------ Ray, device
    def use_gpu(self) -> bool:
        """Whether the workers run on GPUs: ``--device`` when given, else whether the Ray cluster (or, without Ray,
        this process) has one; starts or joins Ray first."""
        cfg = self.cfg
        if cfg.cluster.device != "auto":
            if cfg.cluster.device == "cuda" and not cfg.cluster.use_ray and not torch.cuda.is_available():
                raise ValueError("device='cuda' but no CUDA device is visible")
            if cfg.cluster.use_ray:
                self.init_ray()
            return cfg.cluster.device == "cuda"
        if not cfg.cluster.use_ray:
            return torch.cuda.is_available()
        import ray

        self.init_ray()
        return ray.cluster_resources().get("GPU", 0) > 0

    def cluster_gpus(self) -> float | None:
        if not self.cfg.cluster.use_ray:
            return None
        import ray

        return float(ray.cluster_resources().get("GPU", 0))

    def init_ray(self) -> None:
        """Join ``--ray_address`` (or ``RAY_ADDRESS``), else start a local Ray on ``--bind_host`` (its processes go
        into the run lock)."""
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            address = self.cfg.cluster.ray_address or os.environ.get("RAY_ADDRESS")
            if address:
                with keep_signal_handlers():
                    ray.init(address=address, log_to_driver=True)
            else:
                with keep_signal_handlers():
                    ray.init(ignore_reinit_error=True, log_to_driver=True, include_dashboard=False,
                             _node_ip_address=self.cfg.cluster.bind_host)
                self.started_ray = True
                self.lock.record_processes(_ray_process_ids())
        self.started_local_ray = driver_started_ray()

    def shutdown(self) -> None:
        """Stop Ray if this driver started it."""
        if self.started_ray:
            import ray

            self.started_ray = False
            ray.shutdown()

    # ------------------------------------------------------------------------------------------------ plans
    def plan(self) -> list[AgentPlan]:
        """The agents' plans, made once: the device decided, every agent planned for it, the plans checked (GPU
        counts, vLLM, memory; :func:`~openrlhf_hacpo.trainer.preflight.run_gpu_stack_preflight`), then placed on
        the nodes (:meth:`place_on_nodes`)."""
        plans = plan_agents(self.cfg, on_gpu=self.use_gpu())
        run_gpu_stack_preflight(self.cfg, plans, self.cluster_gpus())
        return self.place_on_nodes(plans)

    def place_on_nodes(self, plans: Sequence[AgentPlan]) -> list[AgentPlan]:
        """``plans`` with the node of every bundle (GPUs; CPUs on a CPU-only run), checked against every node's size
        (``ray.nodes()``); unchanged without Ray and on a one-node cluster, where Ray packs each agent's GPU bundles
        (checked to fit) and CPU workers ask for no CPUs (not checked: they share the node's cores)."""
        if not self.cfg.cluster.use_ray:
            return list(plans)
        import ray

        nodes = nodes_from_ray(ray.nodes())
        on_gpu = any(p.on_gpu for p in plans)
        if len(nodes) < 2 and not on_gpu:
            return list(plans)
        placed = check_node_placement(plans, nodes, self.cfg.cluster.allow_straddle)
        if len(nodes) < 2:
            return list(plans)
        address = {n.node_id: n.label for n in nodes}
        for plan in placed:
            logger.info("placement plan: agent %r: policy bundles on %s; engine bundles on %s", plan.name,
                        ", ".join(address[n] for n in plan.nodes.policy),
                        ", ".join(address[n] for n in plan.nodes.engines) or "(none dedicated)")
        return placed

    # ------------------------------------------------------------------------------------------------ records
    def record_placement(self, groups: Sequence[Any]) -> dict[str, Any]:
        """Log where every worker and engine landed (node address and id, GPU ids) and write it to
        ``<save_path>/placement.json``; ``{}`` without Ray."""
        if not self.cfg.cluster.use_ray:
            return {}
        try:
            placement = {g.name: g.locations() for g in groups}
        except Exception as err:  # noqa: BLE001 - a record, not a reason to stop the run
            logger.warning("could not record where the workers landed: %s: %s", type(err).__name__, err)
            return {}
        for agent, roles in placement.items():
            for role, entries in roles.items():
                if role == "rendezvous":
                    if entries is not None:
                        logger.info("agent %r: DeepSpeed group meets on %s:%d", agent, entries["address"],
                                    entries["port"])
                    continue
                for entry in entries if isinstance(entries, list) else [entries]:
                    index = entry.get("rank", entry.get("engine"))
                    which = f" {index}" if index is not None else ""
                    logger.info("agent %r %s%s on %s (node %s), GPUs %s", agent, role, which, entry["address"],
                                entry["node_id"][:8], ",".join(entry["gpu_ids"]) or "none")
        atomic_write_json(Path(self.cfg.outputs.save_path) / PLACEMENT_FILE, placement)
        self.placement = placement
        return placement

    def record_worker_nodes(self, groups: Sequence[Any]) -> None:
        """Give every agent group the node of each of its workers (from the placement records), for errors."""
        if not (self.cfg.cluster.use_ray and self.placement):
            return
        import ray

        self.node_labels = node_labels(ray.nodes())
        for group in groups:
            group.record_nodes(self.placement.get(group.name, {}), self.node_labels)

    def rank_node(self, agent: str, rank: int | None) -> str | None:
        """How errors name the node of ``agent``'s policy ``rank`` (from the placement records), None if unknown."""
        entries = self.placement.get(agent, {}).get("policy") or []
        entry = next((e for e in entries if e.get("rank") == rank), None)
        if entry is None:
            return None
        return self.node_labels.get(entry["node_id"], entry.get("address"))

    # ------------------------------------------------------------------------------------------------ shared folders
    def check_shared_folders(self, node_ids: list[str]) -> None:
        """Prove that the nodes ``node_ids`` (those hosting a worker) share the run folder and the checkpoint folder
        with the driver (:mod:`openrlhf_hacpo.trainer.fs_check`; no task runs when they are all the driver's)."""
        if not self.cfg.cluster.use_ray:
            return
        import ray

        if not node_ids:
            logger.warning("the workers' nodes are unknown: the shared-folder check of %s is skipped",
                           self.cfg.outputs.save_path)
            return
        Path(self.cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        timeout = min(self.cfg.cluster.step_timeout or FS_CHECK_TIMEOUT_S, FS_CHECK_TIMEOUT_S)
        check_shared_folders([self.cfg.outputs.save_path, self.cfg.checkpoint_dir], node_ids, node_labels(ray.nodes()),
                             ray.get_runtime_context().get_node_id(), timeout_s=timeout)

    def remove_on_worker_nodes(self, path: Path) -> None:
        """Remove ``path`` in the view of every node hosting a worker other than the driver's (a failed save's
        temporary folder, which the driver has removed in its own view)."""
        nodes = worker_node_ids(self.placement)
        if not (self.cfg.cluster.use_ray and nodes):
            return
        import ray

        driver = ray.get_runtime_context().get_node_id()
        remove_on_nodes({node: [str(path)] for node in nodes if node != driver})


def _ray_process_ids() -> list[int]:
    """Pids of the processes this driver has started (Ray's GCS, raylet, workers ...), for the run lock."""
    import psutil

    try:
        return [child.pid for child in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return []
