"""The main job's seed-0 trajectory over its first steps, recorded: what ``tests/test_golden_trajectory.py`` holds
the default path to.

    python tests/golden_trajectory.py --regenerate      # rerun the main job for 3 steps and rewrite the file

The file ``tests/testdata/golden_tiny_model_s0.json`` holds every non-timing metric of every agent's step records
(``metrics.jsonl``) for steps 1-3 of ``python -m openrlhf_hacpo.cli.tiny run --preset model --algorithm hacpo
--seed 0 --steps 3``, the machine it was recorded on (the CPU's model name and torch's CPU capability: another
instruction set rounds the first steps differently in the last bits, and RL amplifies that) and the commit. Its
values change only in the commit that regenerates the README's and ``benchmarks/results/tiny_*`` tables, because a
change to them means the default path computes something else.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_FILE = ROOT / "tests" / "testdata" / "golden_tiny_model_s0.json"
STEPS = 3
TOLERANCE = 1e-6
SKIPPED_PREFIXES = ("time/", "perf/", "rollout/tokens_per_s")
"""Timing and work-rate figures: they vary from run to run."""
REGENERATE = "python tests/golden_trajectory.py --regenerate"


def machine() -> dict[str, str]:
    """What decides the last bits of the CPU run's float sums: the CPU model, torch's kernel capability, torch."""
    import torch

    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor() or "unknown"
    return {"cpu": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def trajectory(metrics_file: Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{step: {agent: {metric: value}}}`` of the steps 1..STEPS, every float metric but timings."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        step = int(record["step"])
        if step > STEPS:
            continue
        values = {k: float(v) for k, v in record.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
                  and not k.startswith(SKIPPED_PREFIXES)}
        out.setdefault(str(step), {})[record["agent"]] = values
    return out


def run_main_job(output: Path) -> Path:
    """Run the main job's seed 0 for STEPS steps into ``output``; returns its ``metrics.jsonl``."""
    cmd = [sys.executable, "-m", "openrlhf_hacpo.cli.tiny", "run", "--preset", "model", "--algorithm", "hacpo",
           "--seed", "0", "--steps", str(STEPS), "--output", str(output), "--no_progress_bar"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return output / "metrics.jsonl"


def differences(want: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """Every (step, agent, metric) whose value differs by more than TOLERANCE (relative above 1), or is missing."""
    out = []
    for step, agents in want.items():
        for agent, values in agents.items():
            mine = got.get(step, {}).get(agent)
            if mine is None:
                out.append(f"step {step} agent {agent}: missing")
                continue
            for key, value in values.items():
                if key not in mine:
                    out.append(f"step {step} agent {agent} {key}: missing (recorded {value!r})")
                elif abs(mine[key] - value) > TOLERANCE * max(1.0, abs(value)):
                    out.append(f"step {step} agent {agent} {key}: {mine[key]!r}, recorded {value!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regenerate", action="store_true", help="rerun the main job and rewrite the golden file")
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "golden-trajectory")
    args = parser.parse_args(argv)
    if not args.regenerate:
        parser.error("nothing to do: pass --regenerate")
    metrics = run_main_job(args.output)
    from openrlhf_hacpo.zoo.job import source_commit

    commit = source_commit()["commit"]
    data = {"command": f"python -m openrlhf_hacpo.cli.tiny run --preset model --algorithm hacpo --seed 0 --steps {STEPS}",
            "commit": commit, "machine": machine(), "tolerance": TOLERANCE, "steps": trajectory(metrics)}
    from openrlhf_hacpo.utils.atomic import atomic_write_text

    atomic_write_text(GOLDEN_FILE, json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN_FILE} ({sum(len(v) for a in data['steps'].values() for v in a.values())} values)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
