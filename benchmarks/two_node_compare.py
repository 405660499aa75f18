"""A tiny run across two Ray nodes against the same run on one node: are the training values the same?

Starts a private two-raylet cluster on this machine (`benchmarks/local_cluster.py`: `ray start` as in
docs/multinode.md, 4 CPUs and a custom resource `nodeA` / `nodeB` per raylet), trains the tiny main job's agents
(the shipped llamaS and qwenM, its 3-digit addition task and reward) with `--device cpu` for a few steps, llama pinned
to nodeA and qwen's two DeepSpeed ranks to nodeB, then the same flags and seed on one node (a local Ray the driver
starts, no pins). Prints, per step and agent, how many non-timing numbers were compared and their largest absolute
and relative difference, where each agent ran, and the mean seconds per step of each run; writes
`benchmarks/results/two_node_compare.md`.

    python benchmarks/two_node_compare.py [--steps 3] [--out benchmarks/results/two_node_compare.md]

Exit status 1 when a non-timing value differs by more than the tolerance (`--rtol`, `--atol`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO, REPO / "benchmarks"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from compare_runs import compare, is_timing, load  # noqa: E402
from local_cluster import LocalCluster  # noqa: E402

from openrlhf_hacpo.utils.atomic import atomic_write_text  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
"""Tolerance of a non-timing value (as for an exact resume): the two runs do the same float operations in the same
order, so they agree far below it."""

TRAIN = [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo"]


def zoo_inputs(data_dir: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The tiny main job's agents (``{"llama": llamaS folder, "qwen": qwenM folder}``, shipped with the package and
    checked against their manifests) and its task's prompt files (``train``, ``eval``) written under ``data_dir``."""
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data
    from openrlhf_hacpo.zoo.shipped import agent_folders

    preset = get_preset("model")
    folders = agent_folders(preset, progress=False)
    return {"llama": folders["llamaS"], "qwen": folders["qwenM"]}, export_task_data(preset.rl, data_dir)


def tiny_flags(steps: int = 3, backend: str | None = "hf") -> list[str]:
    """The run's flags besides agents, prompts and save path: the main job's task settings (chat prompts, its
    response length, temperature and learning rate, the arithmetic reward) at a small batch (2 prompts × 4 samples
    per agent, 16 rows per learner), ``steps`` steps with a joint checkpoint after each, no HF export.
    ``backend`` None leaves ``--rollout_backend`` to the command."""
    from openrlhf_hacpo.zoo import get_preset

    rl = get_preset("model").rl
    flags = ["--input_key", "input", "--label_key", "label", "--apply_chat_template", "--prompt_max_len", "64",
             "--generate_max_len", str(rl.max_new_tokens), "--n_samples_per_prompt", "4", "--rollout_batch_size", "2",
             "--temperature", str(rl.temperature), "--reward_fn", "arithmetic", "--reward_num_workers", "0",
             "--init_kl_coef", "0", "--train_batch_size", "16", "--micro_train_batch_size", "8",
             "--actor_learning_rate", str(rl.lr), "--l2", "0", "--max_steps", str(steps), "--seed", "3",
             "--save_steps", "1", "--max_ckpt_num", str(steps), "--no_save_hf", "--no_progress_bar",
             "--logging_steps", "1"]
    return flags + (["--rollout_backend", backend] if backend else [])


def run_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a trainer and of the raylets: one thread per worker, offline Hugging Face, the prebuilt
    DeepSpeed ops (``.cache/torch_extensions``)."""
    from openrlhf_hacpo.zoo.job import trainer_env

    env = trainer_env()
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **(extra or {})}


def train(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 600.0) -> tuple[subprocess.CompletedProcess,
                                                                                           float]:
    """Run ``train_hacpo`` with ``argv``; returns the finished process (output captured) and its seconds."""
    t0 = time.perf_counter()
    done = subprocess.run([*TRAIN, *argv], env=dict(env), capture_output=True, text=True, timeout=timeout_s,
                          cwd=REPO)
    return done, time.perf_counter() - t0


def agents_flags(agents: Mapping[str, Path], pinned: bool) -> list[str]:
    pins = {"llama": ",node=nodeA", "qwen": ",node=nodeB"} if pinned else {"llama": "", "qwen": ""}
    return ["--agent", f"name=llama,pretrain={agents['llama']}{pins['llama']}",
            "--agent", f"name=qwen,pretrain={agents['qwen']}{pins['qwen']},dp_size=2"]


def comparison_lines(two: Mapping, one: Mapping, rtol: float = RTOL, atol: float = ATOL) -> tuple[list[str], bool]:
    """The table of differences per (step, agent) between two loaded runs (:func:`compare_runs.load`), and whether
    every non-timing value agrees within the tolerance."""
    lines = ["| step | agent | numbers compared | largest abs. difference | largest rel. difference |",
             "|---:|---|---:|---:|---:|"]
    ok = two.keys() == one.keys()
    for key in sorted(two.keys() & one.keys(), key=str):
        diffs = []
        for name, x in two[key].items():
            y = one[key].get(name)
            if is_timing(name) or isinstance(x, bool) or not isinstance(x, (int, float)) \
                    or not isinstance(y, (int, float)):
                continue
            diffs.append((abs(x - y), abs(x - y) / max(abs(x), abs(y), 1e-300)))
        biggest = max((d for d, _ in diffs), default=0.0)
        rel = max((r for _, r in diffs), default=0.0)
        lines.append(f"| {key[0]} | {key[1]} | {len(diffs)} | {biggest:.3g} | {rel:.3g} |")
    problems, _, _ = compare(two, one, rtol, atol)
    return lines, ok and not problems


def step_seconds(run: Mapping) -> float:
    values = [r["time/step"] for r in run.values() if isinstance(r.get("time/step"), (int, float))]
    return statistics.fmean(values) if values else float("nan")


def placement_line(folder: Path, nodes: Mapping[str, str]) -> str:
    """Where each agent's ranks ran (by the node's custom resource) and where its group met."""
    placement = json.loads((folder / "placement.json").read_text())
    parts = []
    for agent, roles in placement.items():
        where = ", ".join(f"rank {p['rank']} on {nodes.get(p['node_id'], p['node_id'][:8])}" for p in roles["policy"])
        meet = roles.get("rendezvous")
        parts.append(f"{agent}: {where}" + (f", group met on {meet['address']}" if meet else ""))
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=RTOL)
    parser.add_argument("--atol", type=float, default=ATOL)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "two_node_compare.md"))
    args = parser.parse_args(argv)
    # this process joins the cluster to name its nodes: Ray reads the mode once, when first imported
    os.environ["RAY_AUTH_MODE"] = "token"

    root = Path(tempfile.mkdtemp(prefix="tnc", dir="/tmp"))  # short: Ray's socket paths live under it
    env = run_env()
    env.pop("RAY_AUTH_MODE")
    cluster = LocalCluster(root / "c", env=env)
    try:
        agents, data = zoo_inputs(root / "data")
        common = ["--device", "cpu", "--prompt_data", str(data["train"]), *tiny_flags(args.steps)]
        started = [cluster.start("a", ["--head", "--node-ip-address", "127.0.0.1", "--port", str(cluster.port),
                                       "--num-cpus", "4", "--resources", '{"nodeA": 1}', "--include-dashboard",
                                       "false", "--disable-usage-stats"]),
                   cluster.start("b", ["--address", cluster.address, "--node-ip-address", "127.0.0.1",
                                       "--num-cpus", "4", "--resources", '{"nodeB": 1}'])]
        nodes = node_names(cluster.address)
        two_dir, one_dir = root / "two_nodes", root / "one_node"
        two, two_s = train(["--ray_address", cluster.address, *agents_flags(agents, pinned=True), *common,
                            "--save_path", str(two_dir)], {**env, "RAY_AUTH_MODE": "token"})
        (root / "one_tmp").mkdir()
        one, one_s = train([*agents_flags(agents, pinned=False), *common, "--save_path", str(one_dir)],
                           {**env, "RAY_TMPDIR": str(root / "one_tmp")})
        for name, done in (("two-node", two), ("one-node", one)):
            if done.returncode != 0:
                print(f"{name} run failed ({done.returncode}):\n{done.stderr[-4000:]}", file=sys.stderr)
                return 1
        table, ok = comparison_lines(load(str(two_dir)), load(str(one_dir)), args.rtol, args.atol)
        text = "\n".join([
            "# A tiny run on two Ray nodes against the same run on one node", "",
            f"Command: `python benchmarks/two_node_compare.py --steps {args.steps}` (2 CPU cores; two raylets on "
            "this machine, 4 CPUs and a custom resource each; the shipped llamaS and qwenM, `--device cpu`, "
            "16 rows per learner per step, seed 3).", "",
            f"Two nodes (`--ray_address`, pinned): {placement_line(two_dir, nodes)}.  ",
            f"One node (a local Ray the driver starts): {placement_line(one_dir, {})}.", "",
            *table, "",
            f"Every non-timing value equal within rtol {args.rtol:g} / atol {args.atol:g}: **{'yes' if ok else 'NO'}**.",
            "",
            "| | two nodes | one node |", "|---|---:|---:|",
            f"| seconds per step (mean of `time/step`) | {step_seconds(load(str(two_dir))):.2f} | "
            f"{step_seconds(load(str(one_dir))):.2f} |",
            f"| wall seconds of the command | {two_s:.1f} | {one_s:.1f} |",
            f"| seconds to start the raylets (head, joining node) | {started[0]:.1f}, {started[1]:.1f} | - |", "",
            f"Load average of the machine at the end (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
            " (other jobs share the cores: the seconds are this machine's at that load, the values do not depend on "
            "it).", ""])
        print(text)
        atomic_write_text(Path(args.out), text)
        return 0 if ok else 1
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def node_names(address: str) -> dict[str, str]:
    """Node id -> its custom resource (``nodeA`` / ``nodeB``) for the alive nodes of the cluster at ``address``
    (joined with ``RAY_AUTH_MODE=token``, set before this process first imports Ray)."""
    import ray

    from openrlhf_hacpo.engines.node_plan import nodes_from_ray

    ray.init(address=address, log_to_driver=False)
    try:
        return {n.node_id: ",".join(sorted(k for k in n.names if k.startswith("node") and ":" not in k))
                for n in nodes_from_ray(ray.nodes())}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
