"""What every benchmark script writes: ``<stem>.json`` and ``<stem>.md`` (and a plot) under ``benchmarks/results``,
with the run's facts: device, versions, platform, the command that produced the figures and when.

A failed run never costs the committed result: :class:`ResultWriter` moves a run's files over ``<stem>.*`` only when
the run finished, each atomically (a reader sees the previous complete file or the new one, never half a file).
Figures written while a run goes, and the error of a run that raised or stopped, go to ``<stem>.failed.md`` beside
the committed files (git-ignored), and the writer prints where. ``HACPO_RESULTS_DIR`` moves the results folder.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time
import traceback
from typing import Any, Mapping, Sequence, Union

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from openrlhf_hacpo.utils.atomic import atomic_write_bytes, atomic_write_text  # noqa: E402

RESULTS_DIR = pathlib.Path(os.environ.get("HACPO_RESULTS_DIR") or ROOT / "benchmarks" / "results")
FAILED_SUFFIX = ".failed.md"
"""``<stem>.failed.md``: the record of a run that did not finish, beside its committed ``<stem>.md``."""

Content = Union[str, bytes, Mapping[str, Any], Sequence[Any]]
"""A result file's content: text, bytes, or an object written as strict JSON (no NaN)."""


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are written to files, never shown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig, title: str | None = None, fontsize: float | None = None) -> bytes:
    """A matplotlib figure as PNG bytes, with its title (``suptitle``) laid out tight; the figure is closed."""
    import io

    import matplotlib.pyplot as plt

    if title is not None:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's with the torch thread count."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return (f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')})")


def run_facts(device: str, argv: Sequence[str] | None, **extra: Any) -> dict[str, Any]:
    """Device, versions, platform, command line and time of a benchmark run (``extra`` is added as given)."""
    import torch

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


def failure_path(stem: str, results_dir: pathlib.Path | str | None = None) -> pathlib.Path:
    """Where the record of a failed run of ``stem`` goes: ``<results_dir>/<stem>.failed.md``."""
    return pathlib.Path(RESULTS_DIR if results_dir is None else results_dir) / f"{stem}{FAILED_SUFFIX}"


def _serialise(name: str, content: Content) -> str | bytes:
    if isinstance(content, (str, bytes)):
        return content if isinstance(content, bytes) or content.endswith("\n") else content + "\n"
    try:
        return json.dumps(content, indent=2, allow_nan=False, ensure_ascii=False) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"cannot write {name} as JSON: {err}") from err


class ResultWriter:
    """The result files of one benchmark run: the complete result over the committed one, anything else beside it.

    ::

        with ResultWriter("kernels_cpu", command=...) as out:
            for shape in shapes:
                rows += measure(shape)
                out.progress(table(rows))          # -> kernels_cpu.failed.md (marked incomplete)
            out.commit({".json": payload, ".md": table(rows)})   # -> kernels_cpu.json, kernels_cpu.md

    :meth:`commit` writes every file (content serialised first, so a payload that cannot be written leaves nothing
    half-done) and deletes a ``<stem>.failed.md`` of an earlier run. An exception in the block before the commit (or
    ``SystemExit`` with a non-zero code), or a block that ends without :meth:`commit` or :meth:`fail`, records the
    failure in ``<stem>.failed.md`` with the last progress figures, prints where, and lets the exception go on.
    """

    def __init__(self, stem: str, results_dir: pathlib.Path | str | None = None, command: str | None = None,
                 name: str | None = None):
        self.stem = stem
        self.results_dir = pathlib.Path(RESULTS_DIR if results_dir is None else results_dir)
        self.command = command if command is not None else " ".join(["python", *sys.argv])
        self.name = name or stem
        self.failed_path = failure_path(stem, self.results_dir)
        self.partial: str | None = None
        self.done = False

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.done:  # committed, or its failure recorded already
            return False
        if exc is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.fail("".join(traceback.format_exception(exc_type, exc, tb)).rstrip())
        else:
            self.fail("the run ended without writing its result")
        return False

    def _header(self, title: str) -> list[str]:
        return [f"# {self.stem}: {title}", "",
                f"The committed result, `{self.stem}.md`, is unchanged: this file records a run that did not "
                f"finish. Command: `{self.command}`, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", ""]

    def progress(self, markdown: str) -> pathlib.Path:
        """Figures of the run so far, to ``<stem>.failed.md`` (they stay there if the run stops)."""
        self.partial = markdown
        lines = self._header("incomplete run")
        lines += ["The run had not finished when this file was written (still going, or stopped). Its figures so "
                  "far:", "", markdown]
        return atomic_write_text(self.failed_path, "\n".join(lines).rstrip() + "\n")

    def commit(self, files: Mapping[str, Content]) -> list[pathlib.Path]:
        """Write ``<stem><suffix>`` for every ``suffix: content`` of ``files`` over the committed files."""
        texts = {suffix: _serialise(f"{self.stem}{suffix}", content) for suffix, content in files.items()}
        written = []
        for suffix, content in texts.items():
            path = self.results_dir / f"{self.stem}{suffix}"
            written.append(atomic_write_bytes(path, content) if isinstance(content, bytes)
                           else atomic_write_text(path, content))
        self.failed_path.unlink(missing_ok=True)
        self.done = True
        return written

    def fail(self, error: str, partial: str | None = None) -> pathlib.Path:
        """Record a failed run in ``<stem>.failed.md`` (its error, and ``partial`` or the last progress figures)
        and print where."""
        self.partial = partial if partial is not None else self.partial
        lines = self._header("failed run") + ["## Error", "", "```", error, "```", ""]
        if self.partial:
            lines += ["## Figures measured before the failure", "", self.partial]
        path = atomic_write_text(self.failed_path, "\n".join(lines).rstrip() + "\n")
        self.done = True
        print(f"{self.name}: the run failed; its record is {path} "
              f"({self.results_dir / self.stem}.* unchanged)", file=sys.stderr)
        return path


def save_results(stem: str, payload: dict[str, Any], markdown: str,
                 results_dir: pathlib.Path | str | None = None) -> None:
    """Write ``<stem>.json`` (``payload``) and ``<stem>.md`` (``markdown``) into ``results_dir`` atomically (a run's
    finished result; see :class:`ResultWriter` for runs that may fail)."""
    ResultWriter(stem, results_dir).commit({".json": json.dumps(payload, indent=2) + "\n", ".md": markdown})
