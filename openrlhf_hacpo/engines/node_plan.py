"""Which node each agent's bundles go to: a pure, deterministic planner over the cluster's nodes.

One agent occupies bundles of two kinds: its policy bundles (``dp_size`` DeepSpeed ranks; the reference and, with
``--colocate_all_models`` on GPUs, the engines take a share of them, so a colocated agent has max(dp, engines × TP)
policy bundles) and, when the engines are dedicated, ``engines × TP`` engine bundles. A bundle is one GPU (with one
CPU) on a GPU cluster and :data:`CPU_BUNDLE_CPUS` CPU(s) on a CPU-only one (``kind`` "GPU" or "CPU": a node's
capacity is its GPUs or its whole CPUs). The planner gives every bundle a node:

* an agent whose bundles all fit on one node gets one node (weight sync to its engines then stays inside the node);
* otherwise its DeepSpeed group stays on one node and each engine's TP shards stay on one node (engines go to the
  policy's node first, then to the node with most free units); with ``allow_straddle`` an agent that cannot be
  placed so fills the nodes with most free units first, bundle by bundle;
* agents pinned to a node (:attr:`AgentDemand.node`) are placed first, in agent order, then the others, largest
  first (ties in agent order); each goes to the node with the most free units, ties broken by address then node id,
  so the same cluster and agents always give the same plan;
* a layout that cannot be placed raises :class:`PlacementError` naming the agent, what it needs and the free GPUs
  (CPUs) of every node after the agents placed before it.

A pin names a node by address (``10.0.0.2``), node id, a custom resource present on exactly that node (``nodeA``,
or Ray's own ``node:10.0.0.2``), or a label ``key=value`` of exactly that node.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CPU_BUNDLE_CPUS", "PLACEMENT_FILE", "AgentDemand", "AgentPlacement", "ClusterNode", "PlacementError",
           "cross_node_sync_bytes", "nodes_from_ray", "plan_nodes", "resolve_pin"]


PLACEMENT_FILE = "placement.json"
"""File in the run folder recording where every agent's workers and engines landed (per role and rank: node address
and id, GPU ids); the tiny main job copies it into ``summary.json`` as ``placement``."""


CPU_BUNDLE_CPUS = 1
"""CPUs of one bundle on a CPU-only cluster: one DeepSpeed rank, one engine shard (the reference shares bundle 0)."""

BUNDLE_KINDS = ("GPU", "CPU")


class PlacementError(ValueError):
    """The agents' bundles cannot be placed on the cluster's nodes (or a pin names no single node)."""


@dataclass(frozen=True)
class ClusterNode:
    """One node of the cluster: Ray node id, address, whole GPUs, CPUs, and the names a pin may match (custom
    resource keys and ``key=value`` labels)."""

    node_id: str
    address: str
    gpus: int
    cpus: float = 0.0
    names: frozenset[str] = field(default_factory=frozenset)

    @property
    def label(self) -> str:
        return f"{self.address} ({self.node_id[:8]})"

    def capacity(self, kind: str = "GPU") -> int:
        """Bundles of ``kind`` the node holds: its GPUs, or its whole CPUs over :data:`CPU_BUNDLE_CPUS`."""
        return int(self.gpus) if kind == "GPU" else int(self.cpus // CPU_BUNDLE_CPUS)


@dataclass(frozen=True)
class AgentDemand:
    """One agent's bundles: ``dp`` policy ranks, ``engines`` vLLM engines of ``tp`` GPUs, colocated (engines and
    reference share the policy's GPUs) or not; ``reference`` when a reference model runs on policy bundle 0;
    ``node`` pins the agent to a node. A run's demands are its agents' plans'
    (:attr:`openrlhf_hacpo.actors.agent_plan.AgentPlan.demand`)."""

    agent: str
    dp: int
    engines: int = 0
    tp: int = 1
    colocated: bool = False
    reference: bool = False
    node: str | None = None

    @property
    def policy_bundles(self) -> int:
        """``dp``, or max(dp, engines × tp) when the engines share the policy's bundles (the one formula)."""
        return max(self.dp, self.engines * self.tp) if self.colocated else self.dp

    @property
    def engine_bundles(self) -> int:
        return 0 if self.colocated else self.engines * self.tp

    @property
    def gpus(self) -> int:
        """All the agent's bundles (GPUs on a GPU cluster, CPU bundles on a CPU-only one)."""
        return self.policy_bundles + self.engine_bundles


@dataclass(frozen=True)
class AgentPlacement:
    """Node id of each of an agent's bundles: ``policy`` (policy bundle r holds rank r; the reference sits on
    bundle 0) and ``engines`` (engine i's TP shards are bundles ``i*tp ... i*tp + tp - 1``)."""

    agent: str
    policy: tuple[str, ...]
    engines: tuple[str, ...]
    tp: int = 1

    @property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes the agent uses, in bundle order."""
        return tuple(dict.fromkeys(self.policy + self.engines))

    def engine_nodes(self, index: int) -> tuple[str, ...]:
        """Nodes of engine ``index``'s shards."""
        return self.engines[index * self.tp:(index + 1) * self.tp]


def resolve_pin(pin: str, nodes: Sequence[ClusterNode], agent: str) -> ClusterNode:
    """The one node ``pin`` names (address, node id, custom resource or ``key=value`` label); a pin matching no
    node or several raises :class:`PlacementError` naming the agent and the nodes."""
    matches = [n for n in nodes if pin in (n.address, n.node_id) or pin in n.names]
    if len(matches) == 1:
        return matches[0]
    listing = "; ".join(f"{n.label}: {', '.join(sorted(n.names)) or 'no custom resources'}" for n in nodes)
    if not matches:
        raise PlacementError(f"agent {agent!r}: node={pin!r} matches no node of the cluster (pin by address, node id, "
                             f"a custom resource or a key=value label); nodes: {listing}")
    raise PlacementError(f"agent {agent!r}: node={pin!r} matches {len(matches)} nodes "
                         f"({', '.join(n.label for n in matches)}); pin by a custom resource present on exactly one "
                         f"node (ray start --resources '{{\"nodeA\": 1}}') or by node id")


def plan_nodes(nodes: Sequence[ClusterNode], demands: Sequence[AgentDemand], allow_straddle: bool = False,
               kind: str = "GPU") -> list[AgentPlacement]:
    """A node for every bundle of every agent (the rules are the module's), bundles of ``kind`` ("GPU" or "CPU");
    returned in the order of ``demands``."""
    if kind not in BUNDLE_KINDS:
        raise ValueError(f"bundle kind must be one of {BUNDLE_KINDS}, got {kind!r}")
    if not nodes:
        raise PlacementError("the cluster has no nodes to place the agents on")
    free = {n.node_id: n.capacity(kind) for n in nodes}
    pins = {d.agent: resolve_pin(d.node, nodes, d.agent) for d in demands if d.node}
    order = sorted(range(len(demands)), key=lambda i: (demands[i].agent not in pins,
                                                       0 if demands[i].agent in pins else -demands[i].gpus, i))
    placed: dict[int, AgentPlacement] = {}
    for i in order:
        demand = demands[i]
        candidates = [pins[demand.agent]] if demand.agent in pins else list(nodes)
        placement = (_on_one_node(demand, candidates, free) or _split(demand, candidates, free)
                     or (_straddle(demand, candidates, free) if allow_straddle else None))
        if placement is None:
            raise PlacementError(_refusal(demand, nodes, free, demand.agent in pins, allow_straddle, kind))
        for node_id in placement.policy + placement.engines:
            free[node_id] -= 1
        placed[i] = placement
    return [placed[i] for i in range(len(demands))]


def _ranked(candidates: Iterable[ClusterNode], free: Mapping[str, int], need: int) -> list[ClusterNode]:
    """Candidates with at least ``need`` free units, most free first, ties by address then node id."""
    fit = [n for n in candidates if free[n.node_id] >= need]
    return sorted(fit, key=lambda n: (-free[n.node_id], n.address, n.node_id))


def _on_one_node(demand: AgentDemand, candidates: Sequence[ClusterNode],
                 free: Mapping[str, int]) -> AgentPlacement | None:
    ranked = _ranked(candidates, free, demand.gpus)
    if not ranked:
        return None
    node = ranked[0].node_id
    return AgentPlacement(demand.agent, (node,) * demand.policy_bundles, (node,) * demand.engine_bundles, demand.tp)


def _split(demand: AgentDemand, candidates: Sequence[ClusterNode],
           free: Mapping[str, int]) -> AgentPlacement | None:
    """Policy group on one node, each dedicated engine on one node (the policy's first when it has room)."""
    if demand.colocated or demand.engine_bundles == 0:
        return None  # colocated engines share the policy's bundles: one group, already tried on one node
    ranked = _ranked(candidates, free, demand.policy_bundles)
    if not ranked:
        return None
    left = dict(free)
    policy_node = ranked[0].node_id
    left[policy_node] -= demand.policy_bundles
    engines: list[str] = []
    for _ in range(demand.engines):
        home = [n for n in candidates if n.node_id == policy_node and left[policy_node] >= demand.tp]
        choice = home or _ranked(candidates, left, demand.tp)
        if not choice:
            return None
        engines.extend([choice[0].node_id] * demand.tp)
        left[choice[0].node_id] -= demand.tp
    return AgentPlacement(demand.agent, (policy_node,) * demand.policy_bundles, tuple(engines), demand.tp)


def _straddle(demand: AgentDemand, candidates: Sequence[ClusterNode],
              free: Mapping[str, int]) -> AgentPlacement | None:
    """Bundle by bundle (policy first), each on the node with most free units left at the start, filled in turn."""
    ranked = _ranked(candidates, free, 1)
    slots = [n.node_id for n in ranked for _ in range(free[n.node_id])]
    if len(slots) < demand.gpus:
        return None
    slots = slots[:demand.gpus]
    return AgentPlacement(demand.agent, tuple(slots[:demand.policy_bundles]), tuple(slots[demand.policy_bundles:]),
                          demand.tp)


def _refusal(demand: AgentDemand, nodes: Sequence[ClusterNode], free: Mapping[str, int], pinned: bool,
             allow_straddle: bool, kind: str = "GPU") -> str:
    unit = "GPU" if kind == "GPU" else "CPU"
    needs = [f"{demand.policy_bundles} {unit} bundle(s) on one node for its policy"
             + (" (DeepSpeed group, reference and colocated engines)" if demand.colocated else
                f" ({demand.dp} DeepSpeed rank(s))")]
    if demand.engine_bundles:
        needs.append(f"{demand.engines} engine(s) of {demand.tp} {unit}(s) each on one node")
    where = "on its pinned node" if pinned else "on any node"
    size = CPU_BUNDLE_CPUS if kind == "CPU" else 1
    has = "; ".join(f"{n.label}: {free[n.node_id] * size:g} of {n.capacity(kind) * size:g} {unit}s free"
                    for n in nodes)
    hint = ("lower dp_size / vllm_num_engines / vllm_tensor_parallel_size, pin the agents to other nodes, or add "
            "nodes" + ("" if allow_straddle or pinned else "; --allow_straddle lets a group span nodes"))
    if kind == "CPU":
        hint += " (a CPU node offers the CPUs its raylet was started with: ray start --num-cpus)"
    return (f"agent {demand.agent!r} cannot be placed {where}: it needs {' and '.join(needs)} "
            f"({demand.gpus * size} {unit}s in all); free {unit}s per node after the agents placed before it: {has}. "
            f"Fix: {hint}")


def cross_node_sync_bytes(placement: AgentPlacement, num_parameters: int, bytes_per_parameter: int = 2) -> int:
    """Bytes of one weight sync that cross nodes: rank 0 sends every parameter to every engine shard (vLLM loads
    the full tensors on each TP worker), so each shard on a node other than rank 0's receives
    ``num_parameters × bytes_per_parameter`` (bf16: 2). Colocated engines share the policy's bundles."""
    if not placement.policy:
        return 0
    home = placement.policy[0]
    return sum(num_parameters * bytes_per_parameter for node in placement.engines if node != home)


def nodes_from_ray(ray_nodes: Sequence[Mapping]) -> list[ClusterNode]:
    """:class:`ClusterNode` records of the alive entries of ``ray.nodes()`` (custom resources other than CPU, GPU,
    memory and object store become names; so do labels, as ``key=value``)."""
    standard = {"CPU", "GPU", "memory", "object_store_memory"}
    out = []
    for entry in ray_nodes:
        if not entry.get("Alive", entry.get("alive", True)):
            continue
        resources = entry.get("Resources", {}) or {}
        names = {key for key in resources if key not in standard and not key.startswith("accelerator_type")}
        names |= {f"{k}={v}" for k, v in (entry.get("Labels") or {}).items()}
        out.append(ClusterNode(node_id=entry["NodeID"], address=entry["NodeManagerAddress"],
                               gpus=int(resources.get("GPU", 0)), cpus=float(resources.get("CPU", 0)),
                               names=frozenset(names)))
    return out
