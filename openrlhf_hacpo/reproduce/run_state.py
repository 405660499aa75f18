"""How ``reproduce_table1.sh`` restarts a training run: continue it, start it over, or start it.

A rerun of the pipeline must continue every run from wherever it stopped. The trainer offers two ways into a run
folder that is not empty: ``--resume`` (continue from the latest joint checkpoint) and ``--overwrite`` (delete the
earlier outputs and start fresh); it refuses ``--resume`` when the folder holds outputs but no checkpoint, and it
refuses the two together. A run stopped before its first checkpoint (the Table 1 runs save every 10 steps) leaves
exactly that: a step-0 ``eval.jsonl`` (and perhaps ``metrics.jsonl``) and no checkpoint. Nothing of it can be
continued, and a fresh start with the same seed writes the same records again, so such a folder is started over.

:func:`restart_flag` decides, from the folder alone:

==================================================================  ================
run folder                                                          flag
==================================================================  ================
a complete joint checkpoint (``global_stepN/trainer_state.pt``), or
a checkpoint that an interrupted save left aside (``.global_stepN.old-*``,
which the trainer renames back when it starts)                      ``--resume``
a run's outputs (``metrics.jsonl``, ``eval.jsonl``, ``hf/``,
``rollouts/``, a non-empty checkpoint folder) but no checkpoint      ``--overwrite``
missing or without outputs                                          (none)
==================================================================  ================

Finished runs are never restarted: the pipeline skips a stage whose done-marker exists.

    python -m openrlhf_hacpo.reproduce.run_state RUN_DIR [--ckpt_path DIR]   # prints the flag (or nothing)
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Sequence

__all__ = ["OVERWRITE", "RESUME", "RUN_OUTPUTS", "STATE_FILE", "has_checkpoint", "main", "restart_flag"]

RESUME = "--resume"
OVERWRITE = "--overwrite"


RUN_OUTPUTS = ("metrics.jsonl", "eval.jsonl", "checkpoints", "hf", "rollouts")
"""The outputs the trainer refuses to replace without ``--overwrite`` (``trainer.run_folder.RUN_OUTPUTS``; named here
so that the decision does not import the trainer, and a test keeps the two equal)."""
STATE_FILE = "trainer_state.pt"
"""The file that makes a ``global_stepN`` folder a complete checkpoint (``trainer.checkpoint.STATE_FILE``)."""
_STEP_DIR = re.compile(r"^global_step\d+$")
_SET_ASIDE = re.compile(r"^\.global_step\d+\.old-.+$")


def has_checkpoint(ckpt_dir: str | Path) -> bool:
    """Whether ``ckpt_dir`` holds a joint checkpoint the trainer can continue from: a complete ``global_stepN``
    (with its trainer state), or one that a save killed between its two renames set aside as
    ``.global_stepN.old-*`` (the trainer renames it back when it starts)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return False
    for child in root.iterdir():
        if child.is_dir() and ((_STEP_DIR.match(child.name) and (child / STATE_FILE).is_file())
                               or _SET_ASIDE.match(child.name)):
            return True
    return False


def _outputs(run_dir: Path, ckpt_dir: Path) -> list[Path]:
    """The earlier run's outputs that the trainer would refuse to replace without ``--overwrite``."""
    paths = [run_dir / name for name in RUN_OUTPUTS] + [ckpt_dir]
    return [p for p in dict.fromkeys(paths) if p.is_file() or (p.is_dir() and any(p.iterdir()))]


def restart_flag(run_dir: str | Path, ckpt_dir: str | Path | None = None) -> str | None:
    """``--resume``, ``--overwrite`` or None for the run folder ``run_dir`` (table in the module docstring).

    ``ckpt_dir`` is the trainer's ``--ckpt_path`` (default ``<run_dir>/checkpoints``).
    """
    run = Path(run_dir)
    ckpt = Path(ckpt_dir) if ckpt_dir is not None else run / "checkpoints"
    if has_checkpoint(ckpt):
        return RESUME
    if _outputs(run, ckpt):
        return OVERWRITE
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.reproduce.run_state",
                                description="Print the trainer flag that continues or restarts a run folder.")
    p.add_argument("run_dir")
    p.add_argument("--ckpt_path", default=None, help="the run's checkpoint folder [<run_dir>/checkpoints]")
    args = p.parse_args(argv)
    flag = restart_flag(args.run_dir, args.ckpt_path)
    if flag is not None:
        print(flag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
