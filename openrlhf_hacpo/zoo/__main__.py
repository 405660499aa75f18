"""``python -m openrlhf_hacpo.zoo``: build, ship, list, verify and evaluate the tiny agents.

    python -m openrlhf_hacpo.zoo build --preset model [--jobs 2] [--cache-dir DIR] [--force]   # into the cache
    python -m openrlhf_hacpo.zoo build --agents llamaS qwenS
    python -m openrlhf_hacpo.zoo ship --agents llamaS qwenM qwenS qwenM-early   # cache -> package, with manifests
    python -m openrlhf_hacpo.zoo list
    python -m openrlhf_hacpo.zoo verify                                        # shipped files against manifests
    python -m openrlhf_hacpo.zoo eval --preset model [--samples 4] [--rebuild]

The main job and the comparison use the shipped agents (:mod:`openrlhf_hacpo.zoo.shipped`); ``build`` makes agents
on this machine from the same recipes, which ``--rebuild`` of those commands then uses.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from openrlhf_hacpo.data.arithmetic import make_splits
from openrlhf_hacpo.zoo.cache import agent_dir, build_zoo, default_cache_dir, is_built, load_agent, read_meta
from openrlhf_hacpo.zoo.evaluate import evaluate_accuracy
from openrlhf_hacpo.zoo.presets import AGENTS, DEFAULT_PRESET, PRESETS, resolve_agents
from openrlhf_hacpo.zoo.shipped import SHIPPED_DIR, agent_folders, read_manifest, ship_agents, verify_folder


def _selection(args: argparse.Namespace):
    return resolve_agents(args.agents) if args.agents else resolve_agents(args.preset)


def _cmd_build(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    paths = build_zoo(_selection(args), args.cache_dir, progress=True, jobs=args.jobs, force=args.force)
    print(f"[zoo] done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    for name, path in paths.items():
        meta = read_meta(path)
        ws = meta["warm_start"]
        print(
            json.dumps(
                {
                    "agent": name,
                    "path": str(path),
                    "sft_steps": ws["steps"],
                    "sft_seconds": round(ws["train_seconds"], 1),
                    "sft_cpu_seconds": round(ws["train_cpu_seconds"], 1) if "train_cpu_seconds" in ws else None,
                    "probe_accuracy": ws["probe_accuracy"],
                    "test_accuracy": meta["test"]["accuracy"],
                }
            )
        )
    return 0


def _cmd_ship(args: argparse.Namespace) -> int:
    specs = _selection(args)
    cache = args.cache_dir or default_cache_dir()
    missing = [s.name for s in specs if not is_built(agent_dir(s, cache), s)]
    if missing:
        print(f"zoo ship: error: not built in {cache}: {', '.join(missing)} (run `python -m openrlhf_hacpo.zoo build "
              f"--agents {' '.join(missing)}` first)", file=sys.stderr)
        return 2
    command = f"python -m openrlhf_hacpo.zoo build --agents <name>"
    shipped = ship_agents({s.name: agent_dir(s, cache) for s in specs}, args.dest, command=command)
    for name, folder in shipped.items():
        manifest = read_manifest(folder)
        print(json.dumps({"agent": name, "path": str(folder), "fingerprint": manifest["fingerprint"],
                          "bytes": sum(f["bytes"] for f in manifest["files"].values()),
                          "test_accuracy": manifest["test_accuracy"]}))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    root = args.dest or SHIPPED_DIR
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
    if not folders:
        print(f"zoo verify: error: no shipped agents under {root}", file=sys.stderr)
        return 2
    for folder in folders:
        manifest = verify_folder(folder)
        print(f"{manifest['name']:12s} {manifest['fingerprint']}  {len(manifest['files'])} files match {folder}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    cache = args.cache_dir or default_cache_dir()
    print(f"shipped: {SHIPPED_DIR}")
    print(f"cache: {cache}")
    for name, spec in AGENTS.items():
        path = agent_dir(spec, cache)
        state = "not built"
        if is_built(path, spec):
            state = f"built, test accuracy {read_meta(path)['test']['accuracy']:.3f}"
        try:
            manifest = read_manifest(SHIPPED_DIR / name)
            shipped = f"shipped {manifest['fingerprint']}, test accuracy {manifest['test_accuracy']:.3f}"
        except FileNotFoundError:
            shipped = "not shipped"
        print(f"  {name:12s} {spec.model.family:6s} {spec.tokenizer:5s} {shipped}; cache: {state}")
    for name, preset in PRESETS.items():
        print(f"  preset {name:6s} {'+'.join(preset.agent_names):28s} {preset.description}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    paths = agent_folders(_selection(args), args.cache_dir, rebuild=args.rebuild, progress=True)
    problems = make_splits()[args.split]
    for name, path in paths.items():
        model, tokenizer = load_agent(path)
        t0 = time.perf_counter()
        result = evaluate_accuracy(model, tokenizer, problems, num_samples=args.samples)
        print(json.dumps({"agent": name, **result.summary(), "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.zoo", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_text in (
        ("build", _cmd_build, "build (or reuse) agents in the zoo cache"),
        ("ship", _cmd_ship, "copy built agents into the package's shipped agents, with manifests"),
        ("list", _cmd_list, "list agents, presets, what ships and what is cached"),
        ("verify", _cmd_verify, "check the shipped agents' files against their manifests"),
        ("eval", _cmd_eval, "evaluate agents on a split (the shipped ones unless --rebuild)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(fn=fn)
        p.add_argument("--cache-dir", default=None, help="zoo folder (default: $HACPO_CACHE_DIR/zoo or .cache/zoo)")
        if name in ("ship", "verify"):
            p.add_argument("--dest", type=Path, default=None, help=f"shipped agents folder (default {SHIPPED_DIR})")
        if name in ("list", "verify"):
            continue
        p.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS))
        p.add_argument("--agents", nargs="+", choices=sorted(AGENTS), help="agents instead of a preset")
        if name == "build":
            p.add_argument("--jobs", type=int, default=1, help="parallel build processes (one thread each)")
            p.add_argument("--force", action="store_true", help="rebuild even when cached")
        elif name == "eval":
            p.add_argument("--rebuild", action="store_true", help="agents built on this machine, not the shipped ones")
            p.add_argument("--split", default="test", choices=("validation", "test"))
            p.add_argument("--samples", type=int, default=0, help="samples per problem for pass@k (T=1)")
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
