"""One ninja for every build of DeepSpeed's JIT ops.

DeepSpeed compiles its CPU ops (the shared-memory collective, CPU Adam) with torch's ``cpp_extension``, which runs
the first ``ninja`` on ``PATH`` and keeps the build in ``TORCH_EXTENSIONS_DIR``. Two ninja versions record the same
build command differently in ``.ninja_log``, so each finds the other's build out of date and compiles the op again
(over a minute on 2 cores). The project's environment has its own ninja (``.venv/bin``, a DeepSpeed requirement),
but whether it comes first on ``PATH`` depends on whether the environment is activated: an install from a plain
shell and a run from an activated one would rebuild in turn. :func:`use_interpreter_ninja` makes every process that
may build (install, training workers) use the running interpreter's ninja.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["use_interpreter_ninja"]


def use_interpreter_ninja() -> str | None:
    """Put the running interpreter's ``bin`` folder first on ``PATH`` when it holds a ``ninja``; returns that
    folder, or None (no ninja beside the interpreter: ``PATH`` is left as it is)."""
    folder = str(Path(sys.executable).parent)
    if shutil.which("ninja", path=folder) is None:
        return None
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != folder]
    os.environ["PATH"] = os.pathsep.join([folder, *parts])
    return folder
