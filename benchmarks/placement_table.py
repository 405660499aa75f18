"""Where the node planner (`openrlhf_hacpo.engines.node_plan`) puts two and three agents on 2 nodes x 8 GPUs, and the
weight-sync bytes that cross nodes per step. Arithmetic on the published model configs (nothing is downloaded, no Ray
is started). Writes ``benchmarks/results/placement_table.md``.

    python benchmarks/placement_table.py [--out benchmarks/results/placement_table.md]

A weight sync sends every parameter from the policy's rank 0 to every engine shard (a TP worker loads the full
tensors), in bf16 (2 bytes per parameter); a shard on another node than rank 0's costs P x 2 bytes of cross-node
traffic per step. "engines apart" is that figure when every engine shard sits on another node than its policy (as
Ray's unplanned packing put them for two dp-4 agents with 4 engines each): the traffic the plan avoids.

Layouts: the paper's launcher (``examples/scripts/train_table1.sh``: dp 2 and 2 engines of TP 1 per agent) with its
Qwen3-4B / Llama-3.2-3B pair and a third agent (Qwen3-1.7B); two larger layouts (two Qwen3-8B agents at dp 4 with two
TP-2 engines each; three agents of 6, 4 and 4 GPUs); and an agent larger than a node (Qwen3-8B at dp 8 with two TP-2
engines), whose engines cannot share its node.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openrlhf_hacpo.engines.node_plan import (  # noqa: E402
    AgentDemand,
    ClusterNode,
    cross_node_sync_bytes,
    plan_nodes,
)
from openrlhf_hacpo.utils.atomic import atomic_write_text  # noqa: E402

BF16_BYTES = 2
NODES = [ClusterNode("node-a", "10.0.0.1", 8, 64.0), ClusterNode("node-b", "10.0.0.2", 8, 64.0)]

# config.json values of the models (hub pages of Qwen/Qwen3-*-Base, meta-llama/Llama-3.2-3B-Instruct)
CONFIGS = {
    "Qwen3-1.7B": dict(vocab=151936, hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                       tied=True, qk_norm=True),
    "Qwen3-4B": dict(vocab=151936, hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728, tied=True,
                     qk_norm=True),
    "Qwen3-8B": dict(vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                     tied=False, qk_norm=True),
    "Llama-3.2-3B": dict(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192,
                         tied=True, qk_norm=False),
}


def parameters(c: dict) -> int:
    """Parameters of a dense decoder: embedding (and an untied head), per layer the q/k/v/o projections, the
    SwiGLU MLP (3 x hidden x ffn), two RMSNorms (and Qwen3's q/k norms of head_dim each), and the final norm."""
    h, d = c["hidden"], c["head_dim"]
    attention = h * c["heads"] * d + 2 * h * c["kv_heads"] * d + c["heads"] * d * h + (2 * d if c["qk_norm"] else 0)
    layer = attention + 3 * h * c["ffn"] + 2 * h
    return c["vocab"] * h * (1 if c["tied"] else 2) + c["layers"] * layer + h


def table1(model: str, name: str) -> tuple[str, AgentDemand]:
    return model, AgentDemand(name, dp=2, engines=2, tp=1, reference=True)


LAYOUTS = {
    "Table 1, two agents": [table1("Qwen3-4B", "qwen4b"), table1("Llama-3.2-3B", "llama3b")],
    "Table 1, three agents": [table1("Qwen3-4B", "qwen4b"), table1("Llama-3.2-3B", "llama3b"),
                              table1("Qwen3-1.7B", "qwen1.7b")],
    "larger, two agents": [("Qwen3-8B", AgentDemand("qwen8b-a", dp=4, engines=2, tp=2, reference=True)),
                           ("Qwen3-8B", AgentDemand("qwen8b-b", dp=4, engines=2, tp=2, reference=True))],
    "larger, three agents": [("Qwen3-8B", AgentDemand("qwen8b", dp=4, engines=1, tp=2, reference=True)),
                             table1("Qwen3-4B", "qwen4b"), table1("Llama-3.2-3B", "llama3b")],
    "agent larger than a node": [("Qwen3-8B", AgentDemand("qwen8b", dp=8, engines=2, tp=2, reference=True)),
                                 table1("Qwen3-1.7B", "qwen1.7b")],
}


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n else "0"


def build_table() -> str:
    address = {n.node_id: n.address for n in NODES}
    lines = ["# Node placement of two and three agents on 2 nodes x 8 GPUs", "",
             "Command: `python benchmarks/placement_table.py` (arithmetic; no Ray, no GPUs). Nodes "
             + ", ".join(f"{n.address} ({n.gpus} GPUs)" for n in NODES) + ". Per agent: its policy's node (rank 0 "
             "and the reference there too), its engines' nodes, and the bf16 weight-sync bytes per step that cross "
             "nodes under the plan and with every engine shard on another node than its policy (`engines apart`).",
             ""]
    for title, agents in LAYOUTS.items():
        demands = [d for _, d in agents]
        plan = plan_nodes(NODES, demands)
        lines += [f"## {title}", "",
                  "| agent | model | parameters | dp | engines x TP | GPUs | policy node | engine nodes "
                  "| cross-node bytes / step | engines apart |",
                  "|---|---|---:|---:|---|---:|---|---|---:|---:|"]
        total = apart_total = 0
        for (model, demand), placement in zip(agents, plan):
            p = parameters(CONFIGS[model])
            crossing = cross_node_sync_bytes(placement, p, BF16_BYTES)
            apart = demand.engine_bundles * p * BF16_BYTES
            total, apart_total = total + crossing, apart_total + apart
            engines = ", ".join(address[n] for n in dict.fromkeys(placement.engines)) or "-"
            lines.append(f"| {demand.agent} | {model} | {p:,} | {demand.dp} | {demand.engines} x {demand.tp} "
                         f"| {demand.gpus} | {address[placement.policy[0]]} | {engines} | {gb(crossing)} "
                         f"| {gb(apart)} |")
        used = {n.address: sum(1 for pl in plan for b in pl.policy + pl.engines if b == n.node_id) for n in NODES}
        lines += ["", f"GPUs used per node: {', '.join(f'{a} {u}' for a, u in used.items())}; cross-node weight "
                  f"sync per step: {gb(total)} under the plan, {gb(apart_total)} with the engines apart.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "placement_table.md"))
    args = parser.parse_args(argv)
    table = build_table()
    print(table)
    atomic_write_text(args.out, table)


if __name__ == "__main__":
    main()
