"""What every benchmark script writes: ``<stem>.json`` and ``<stem>.md`` under ``benchmarks/results``, atomically
(a run cut short leaves the previous complete files or the new ones, never half a file), with the run's facts:
device, versions, platform, the command that produced the figures and when."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time
from typing import Any, Sequence

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from openrlhf_hacpo.utils.atomic import atomic_write_text  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's with the torch thread count."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    return (f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')})")


def run_facts(device: str, argv: Sequence[str] | None, **extra: Any) -> dict[str, Any]:
    """Device, versions, platform, command line and time of a benchmark run (``extra`` is added as given)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "n/a"
    args = list(argv) if argv is not None else sys.argv[1:]
    return {
        "device": device,
        "device_name": device_name(device),
        "command": "python " + " ".join([pathlib.Path(sys.argv[0]).as_posix()] + args),
        "torch": torch.__version__,
        "triton": triton_version,
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }


def save_results(stem: str, payload: dict[str, Any], markdown: str, results_dir: pathlib.Path = RESULTS_DIR) -> None:
    """Write ``<stem>.json`` (``payload``) and ``<stem>.md`` (``markdown``) into ``results_dir`` atomically."""
    results_dir = pathlib.Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(results_dir / f"{stem}.json", json.dumps(payload, indent=2) + "\n")
    atomic_write_text(results_dir / f"{stem}.md", markdown if markdown.endswith("\n") else markdown + "\n")
