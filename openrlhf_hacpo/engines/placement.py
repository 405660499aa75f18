"""Where vLLM engine actors and their workers sit: GPU bundles (dedicated or shared with a policy), CPU cores.

Pure functions of counts, so the arithmetic is tested without Ray or GPUs:

* `plan_engine_placements`: per engine, the bundle of its actor, the GPU share the actor asks for, and, with tensor
  parallelism, the bundles of its workers. With TP > 1 vLLM starts one Ray worker per shard inside the actor's
  placement group; without `VLLM_RAY_BUNDLE_INDICES` each worker asks for a whole GPU on the group's first bundles,
  which a colocated policy already holds a share of, and the engine never starts. The plan names engine i's bundles
  (`i*tp ... i*tp + tp - 1` in node order) and the GPU share of each worker (`VLLM_RAY_PER_WORKER_GPUS`), as
  OpenRLHF's `get_bundle_indices` does.
* `spread_cpu_cores`: disjoint core ranges for CPU engines (`VLLM_CPU_OMP_THREADS_BIND`), so engines of several
  agents on one host do not all pin themselves to core 0.
* `bundle_group`: an agent's GPU bundles (or, on a CPU-only cluster, CPU bundles) as a placement group, each pinned
  to the node a :mod:`~openrlhf_hacpo.engines.node_plan` plan gives it; `actor_locations`: where actors landed
  (node, GPU ids).
* `ray_noset_visible_devices`: Ray leaves `CUDA_VISIBLE_DEVICES` alone when `RAY_EXPERIMENTAL_NOSET_*` is set;
  a process then selects its GPU itself from `ray.get_gpu_ids()`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COLOCATED_WORKER_GPU_SHARE = 0.2
"""GPU share of a colocated engine's actor (TP 1) or of each of its workers (TP > 1); the policy and the reference
hold the rest of the bundle's GPU (OpenRLHF's value)."""

NOSET_VISIBLE_DEVICES_ENV_VARS = (
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
)


@dataclass(frozen=True)
class EnginePlacement:
    """Where one engine goes.

    Attributes:
        bundle_index: bundle of the engine actor in its placement group.
        actor_gpus: GPUs the actor asks for (0 with TP > 1: its workers hold the GPUs).
        worker_bundles: bundles of the TP workers, in shard order (`VLLM_RAY_BUNDLE_INDICES`); None for TP 1.
        per_worker_gpus: GPUs each TP worker asks for (`VLLM_RAY_PER_WORKER_GPUS`); None for TP 1.
    """

    bundle_index: int
    actor_gpus: float
    worker_bundles: tuple[int, ...] | None
    per_worker_gpus: float | None

    def vllm_env(self) -> dict[str, str]:
        """The environment vLLM's Ray executor reads when it places the workers."""
        if self.worker_bundles is None:
            return {}
        return {"VLLM_RAY_BUNDLE_INDICES": ",".join(str(b) for b in self.worker_bundles),
                "VLLM_RAY_PER_WORKER_GPUS": str(self.per_worker_gpus)}


def plan_engine_placements(num_engines: int, tensor_parallel_size: int, colocated: bool,
                           bundle_order: Sequence[int] | None = None) -> list[EnginePlacement]:
    """Placements of `num_engines` engines of `tensor_parallel_size` shards each in one placement group.

    `bundle_order` lists the group's bundle indices grouped by node (default 0, 1, ...): engine i takes entries
    `i*tp ... i*tp + tp - 1`, so an engine's shards share a node. Dedicated engines take whole GPUs; colocated ones
    take `COLOCATED_WORKER_GPU_SHARE` of each GPU they share with a policy.
    """
    if num_engines < 1 or tensor_parallel_size < 1:
        raise ValueError(f"need num_engines >= 1 and tensor_parallel_size >= 1, got {num_engines}, "
                         f"{tensor_parallel_size}")
    needed = num_engines * tensor_parallel_size
    order = list(range(needed)) if bundle_order is None else list(bundle_order)
    if len(order) < needed:
        raise ValueError(f"{num_engines} engines of tensor-parallel size {tensor_parallel_size} need {needed} "
                         f"bundles, the placement group has {len(order)}")
    share = COLOCATED_WORKER_GPU_SHARE if colocated else 1.0
    placements = []
    for index in range(num_engines):
        bundles = tuple(order[index * tensor_parallel_size:(index + 1) * tensor_parallel_size])
        if tensor_parallel_size == 1:
            placements.append(EnginePlacement(bundles[0], share, None, None))
        else:
            placements.append(EnginePlacement(bundles[0], 0.0, bundles, share))
    return placements


def node_sorted_bundles(placement_group) -> list[int]:
    """The group's bundle indices grouped by the node each bundle landed on (Ray may interleave nodes)."""
    import ray

    table = ray.util.placement_group_table(placement_group)
    by_node: dict[str, list[int]] = {}
    for bundle, node_id in sorted(table["bundles_to_node_id"].items()):
        by_node.setdefault(node_id, []).append(int(bundle))
    return [bundle for bundles in by_node.values() for bundle in bundles]


def bundle_group(count: int, node_ids: Sequence[str] | None = None, kind: str = "GPU"):
    """A placement group of ``count`` bundles, ``{GPU: 1, CPU: 1}`` (``kind`` "GPU") or ``{CPU:``
    :data:`~openrlhf_hacpo.engines.node_plan.CPU_BUNDLE_CPUS` ``}`` ("CPU"): PACK as Ray likes (``node_ids`` None, one
    node clusters), or bundle i pinned to node ``node_ids[i]`` by its ``ray.io/node-id`` label (STRICT_PACK when every
    bundle is on one node)."""
    from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

    from openrlhf_hacpo.engines.node_plan import CPU_BUNDLE_CPUS

    if kind not in ("GPU", "CPU"):
        raise ValueError(f"bundle kind must be 'GPU' or 'CPU', got {kind!r}")
    bundle = {"GPU": 1, "CPU": 1} if kind == "GPU" else {"CPU": CPU_BUNDLE_CPUS}
    bundles = [dict(bundle) for _ in range(count)]
    if node_ids is None:
        return placement_group(bundles, strategy="PACK")
    if len(node_ids) != count:
        raise ValueError(f"{count} bundles but {len(node_ids)} node ids")
    strategy = "STRICT_PACK" if len(set(node_ids)) == 1 else "PACK"
    return placement_group(bundles, strategy=strategy,
                           bundle_label_selector=[{NODE_ID_LABEL_KEY: node} for node in node_ids])


def actor_locations(actors: Sequence, timeout_s: float | None = None) -> list[dict]:
    """Where running actors sit, each ``{"node_id", "address", "gpu_ids"}`` (its Ray node, that node's address, the
    GPU ids Ray assigned to it), asked inside each actor (``__ray_call__`` works for any actor class)."""
    import ray

    return ray.get([actor.__ray_call__.remote(_here) for actor in actors], timeout=timeout_s)


def _here(_instance) -> dict:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "address": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def spread_cpu_cores(num_engines: int, available_cores: Sequence[int], cores_per_engine: int | None = None,
                     ) -> list[str]:
    """`VLLM_CPU_OMP_THREADS_BIND` values giving each CPU engine its own cores.

    The available cores are split into `num_engines` consecutive, disjoint ranges (`cores_per_engine` each, default
    an equal share, at least 1); with fewer cores than engines, engine i gets core `i mod cores` (sharing is then
    unavoidable, but no core carries more than ceil(engines / cores) engines).
    """
    cores = sorted(set(int(c) for c in available_cores))
    if num_engines < 1:
        raise ValueError(f"num_engines must be >= 1, got {num_engines}")
    if not cores:
        raise ValueError("no CPU cores available to bind vLLM engines to")
    if cores_per_engine is None:
        cores_per_engine = max(1, len(cores) // num_engines)
    if cores_per_engine < 1:
        raise ValueError(f"cores_per_engine must be >= 1, got {cores_per_engine}")
    binds = []
    for index in range(num_engines):
        start = index * cores_per_engine
        if start + cores_per_engine <= len(cores):
            chosen = cores[start:start + cores_per_engine]
        else:
            chosen = [cores[index % len(cores)]]
        binds.append(",".join(str(c) for c in chosen))
    return binds


def ray_noset_visible_devices(env: Mapping[str, str] | None = None) -> bool:
    """True when Ray was told not to set `CUDA_VISIBLE_DEVICES` (or its ROCm twins) for its workers."""
    env = os.environ if env is None else env
    return any(env.get(name) for name in NOSET_VISIBLE_DEVICES_ENV_VARS)


def actor_device(requested: str = "auto"):
    """The torch device a policy or reference worker runs on: CPU when ``requested`` is ``"cpu"`` (``--device
    cpu``) or without CUDA; otherwise the first GPU Ray assigned to this actor when Ray leaves
    `CUDA_VISIBLE_DEVICES` alone (every GPU of the node is then visible, so the current device would be GPU 0 for
    every actor), else the current CUDA device."""
    import torch

    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if ray_noset_visible_devices():
        import ray

        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
        if gpu_ids:
            torch.cuda.set_device(int(float(gpu_ids[0])))
    return torch.device("cuda", torch.cuda.current_device())


def wait_placement_group(placement_group, timeout_s: float, what: str, kind: str = "GPU") -> None:
    """Wait until Ray has placed `placement_group`; after `timeout_s` remove it and raise `TimeoutError` naming
    `what` (e.g. "agent 'qwen': 4 policy GPUs"), with the cluster's total and free GPUs (CPUs for ``kind`` "CPU")."""
    import ray
    from ray.util.placement_group import remove_placement_group

    ready, _ = ray.wait([placement_group.ready()], timeout=timeout_s)
    if ready:
        return
    remove_placement_group(placement_group)
    total = ray.cluster_resources().get(kind, 0)
    free = ray.available_resources().get(kind, 0)
    raise TimeoutError(f"{what}: Ray could not place the placement group within {timeout_s:.0f} s (the cluster "
                       f"has {total:g} {kind}s, {free:g} free); lower the agents' {kind} counts or add nodes")
