"""The embedded default: tiny heterogeneous agents learn 3-digit addition together on a CPU, in minutes.

    python -m openrlhf_hacpo.cli.tiny prepare  [--preset model]            # check the agents, export the task
    python -m openrlhf_hacpo.cli.tiny run      [--preset model] [--algorithm hacpo] [--seed 0] [-- TRAINER FLAGS]
    python -m openrlhf_hacpo.cli.tiny evaluate [--preset model | --run runs/tiny-model-hacpo-s0]

``run`` is the main job (:func:`openrlhf_hacpo.zoo.job.run_main_job`: the shipped agents, evaluate, train through
the ``train_hacpo`` command, evaluate again, the table beside the README's numbers, ``summary.json`` and
``validation.png`` in the run folder); the summary, table and plot come from :mod:`openrlhf_hacpo.zoo.reports`.
Every command takes the agents that ship with the package; ``--rebuild`` takes agents built on this machine from
the same recipes instead (built once into the zoo cache), which results name by their own fingerprints. This module only parses the command line; it imports
the zoo inside the commands, after :func:`main` has set the environment defaults (one thread, quiet Hugging Face
progress bars) that those libraries read when they are imported.
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()
"""When this command started: the main job's clock and wall time count the imports too."""

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Sequence  # noqa: E402

from openrlhf_hacpo.algorithms import PRESETS as ALGORITHMS  # noqa: E402
from openrlhf_hacpo.utils.options import split_passthrough  # noqa: E402

__all__ = ["build_parser", "main"]


# ---------------------------------------------------------------------------------------------------------- commands
def _cmd_prepare(args: argparse.Namespace) -> int:
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data
    from openrlhf_hacpo.zoo.shipped import agent_folders

    preset = get_preset(args.preset)
    paths = agent_folders(preset.agents, args.cache_dir, rebuild=args.rebuild, progress=True, jobs=args.jobs)
    data = export_task_data(preset.rl, args.data_dir, args.cache_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    for name, path in data.items():
        print(f"{name} prompts: {path}")
    return 0


def _cmd_run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    from openrlhf_hacpo.zoo.job import MainJobConfig, run_main_job

    cfg = MainJobConfig(preset=args.preset, algorithm=args.algorithm, regime=args.regime,
                        n_samples_per_prompt=args.n_samples_per_prompt,
                        steps=args.steps, seed=args.seed, eval_steps=args.eval_steps, output=args.output,
                        cache_dir=args.cache_dir, data_dir=args.data_dir, rebuild=args.rebuild, build_jobs=args.jobs,
                        extra_args=tuple(extra), progress=not args.no_progress_bar)
    run_main_job(cfg, started=_STARTED)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import evaluate_folders, task_config
    from openrlhf_hacpo.zoo.shipped import agent_folders

    preset = get_preset(args.preset)
    rl = preset.rl
    if args.run is not None:
        hf = Path(args.run) / "hf"
        if not hf.is_dir():
            raise FileNotFoundError(f"--run {args.run}: no hf/ folder (has the run finished?)")
        folders = {p.name: p for p in sorted(hf.iterdir()) if p.is_dir()}
    else:
        folders = agent_folders(preset.agents, args.cache_dir, rebuild=args.rebuild, progress=True, jobs=args.jobs)
    problems = make_splits(task_config(rl))[args.split]
    if args.max_problems is not None:
        problems = problems[: args.max_problems]
    t0 = time.perf_counter()
    accs = evaluate_folders(folders, problems, rl.max_new_tokens)
    names = {}
    if args.run is None:
        from openrlhf_hacpo.zoo.shipped import agent_records

        names = {n: f"{r['source']} {r['fingerprint']}" for n, r in agent_records(folders).items()}
    print(f"| agent | greedy accuracy ({len(problems)} {args.split} problems) |")
    print("|---|---|")
    for name, acc in accs.items():
        print(f"| {name}{' (' + names[name] + ')' if name in names else ''} | {acc:.3f} |")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from openrlhf_hacpo.zoo import DEFAULT_PRESET, PRESETS, REGIMES
    from openrlhf_hacpo.zoo.presets import DEFAULT_REGIME

    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_hacpo.cli.tiny",
        description="Tiny heterogeneous agents that learn 3-digit addition together on a CPU.",
        epilog="Trainer flags after '--' are passed to train_hacpo, e.g. `run -- --micro_train_batch_size 32`.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="agents: model (llamaS + qwenM), size, state, three")
    common.add_argument("--cache_dir", "--cache-dir", type=Path, default=None,
                        help="zoo folder (default: $HACPO_CACHE_DIR/zoo or <repo>/.cache/zoo)")
    common.add_argument("--rebuild", action="store_true",
                        help="use agents built on this machine from the shipped agents' recipes (built once into the "
                        "zoo cache; a few minutes) instead of the shipped agents; results name them by their own "
                        "fingerprints")
    common.add_argument("--jobs", type=int, default=2, help="parallel processes for building agents (--rebuild)")

    p = sub.add_parser("prepare", parents=[common], help="check the preset's agents and export the task jsonl")
    p.add_argument("--data_dir", "--data-dir", type=Path, default=None, help="where train/eval jsonl go")

    p = sub.add_parser("run", parents=[common], help="the main job: evaluate, train together, evaluate again")
    p.add_argument("--algorithm", default="hacpo", choices=ALGORITHMS,
                   help="hacpo; gspo / grpo (each agent alone); naive-paper (shared rollouts, plain advantages, "
                   "foreign rows weighted by their plain importance ratio); naive-gated (shared rollouts, plain "
                   "advantages, GSPO's own-row clip on foreign rows too); or a HACPO ablation")
    p.add_argument("--regime", default=DEFAULT_REGIME, choices=sorted(REGIMES),
                   help="; ".join(f"{r.name}: {r.description}" for r in REGIMES.values()))
    p.add_argument("--n_samples_per_prompt", type=int, default=None, help="G per agent [preset: 8]")
    p.add_argument("--steps", type=int, default=None, help="training steps [preset: 80]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval_steps", type=int, default=None, help="evaluate every N steps [preset: 10]")
    p.add_argument("--output", type=Path, default=None,
                   help="run folder [<repo>/runs/tiny-<preset>-<algorithm>-s<seed>[-<regime>]]")
    p.add_argument("--data_dir", "--data-dir", type=Path, default=None, help="where train/eval jsonl go")
    p.add_argument("--no_progress_bar", action="store_true")

    p = sub.add_parser("evaluate", parents=[common], help="greedy accuracy of the zoo agents or of a run's agents")
    p.add_argument("--run", type=Path, default=None, help="a run folder (evaluates its hf/<agent> models)")
    p.add_argument("--split", default="test", choices=("validation", "test"))
    p.add_argument("--max_problems", type=int, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    if extra and args.command != "run":
        print(f"tiny {args.command}: error: trainer flags after '--' only apply to `run`", file=sys.stderr)
        return 2
    try:
        if args.command == "prepare":
            return _cmd_prepare(args)
        if args.command == "run":
            return _cmd_run(args, extra)
        return _cmd_evaluate(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"tiny {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"tiny {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
