"""Metric sinks of a run: ``metrics.jsonl`` / ``eval.jsonl`` (one record per step and agent), TensorBoard, W&B, and a
tqdm progress bar with the key figures.

Records are flat dicts: ``{"step": 3, "agent": "qwen", "reward/mean": 0.41, "capability": 0.38, ...}``. In
TensorBoard and W&B every number becomes the scalar ``<agent>/<key>`` at that step. On resume the jsonl files are cut
back to the resumed step, so a record never appears twice.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from openrlhf_hacpo.utils.jsonl import read_records
from openrlhf_hacpo.utils.atomic import atomic_write_text

__all__ = ["MetricsLogger", "progress_postfix"]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def progress_postfix(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Key figures of one step for the progress bar: reward and capability per agent."""
    out = {}
    for rec in records:
        name = rec["agent"]
        out[f"{name}.r"] = f"{rec.get('reward/mean', float('nan')):.3f}"
        out[f"{name}.P"] = f"{rec.get('capability', float('nan')):.3f}"
    return out


class MetricsLogger:
    """Writes step and evaluation records to every configured sink.

    Args:
        save_path: run folder (``metrics.jsonl`` and ``eval.jsonl`` go there).
        tensorboard_dir: TensorBoard log folder, or None.
        wandb: keyword arguments for ``wandb.init`` (``project``, ``name``, ``mode``, ``config``), or None.
        total_steps: length of the progress bar; ``show_progress`` turns it on.
        initial_step: the step the run (re)starts from.
    """

    def __init__(self, save_path: str, tensorboard_dir: str | None = None, wandb: dict[str, Any] | None = None,
                 total_steps: int | None = None, show_progress: bool = True, initial_step: int = 0) -> None:
        self.dir = Path(save_path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.eval_path = self.dir / "eval.jsonl"
        self._truncate(initial_step)
        self._tb = None
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=tensorboard_dir, purge_step=initial_step + 1 if initial_step else None)
        self._wandb = None
        if wandb is not None:
            try:
                import wandb as wandb_lib
            except ImportError as err:
                raise ImportError("--use_wandb needs the wandb package: pip install 'openrlhf-hacpo[wandb]'") from err
            self._wandb = wandb_lib.init(dir=str(self.dir), **wandb)
        self._bar = None
        if show_progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, desc="hacpo", unit="step", dynamic_ncols=True)

    def _truncate(self, step: int) -> None:
        """Drop records after ``step`` (all records for a fresh run) so a resumed run appends cleanly."""
        for path in (self.metrics_path, self.eval_path):
            if not path.exists():
                continue
            keep = [r for r in read_records(path) if step and r.get("step", 0) <= step]
            atomic_write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in keep))

    @staticmethod
    def _append(path: Path, records: Iterable[dict[str, Any]]) -> None:
        with open(path, "a", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(_json_safe(rec), allow_nan=False, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _scalars(self, step: int, records: Sequence[dict[str, Any]], prefix: str = "") -> None:
        flat = {}
        for rec in records:
            for key, value in rec.items():
                if key in ("step", "agent") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    flat[f"{prefix}{rec['agent']}/{key}"] = float(value)
        if self._tb is not None:
            for key, value in flat.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(flat, step=step)

    def log_step(self, step: int, records: Sequence[dict[str, Any]]) -> None:
        """One record per agent for ``step``."""
        self._append(self.metrics_path, records)
        self._scalars(step, records)

    def log_eval(self, step: int, records: Sequence[dict[str, Any]]) -> None:
        self._append(self.eval_path, records)
        self._scalars(step, records, prefix="eval/")

    def advance(self, records: Sequence[dict[str, Any]] | None = None) -> None:
        """Move the progress bar one step, showing the key figures of ``records``."""
        if self._bar is not None:
            if records:
                self._bar.set_postfix(progress_postfix(records), refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
