"""Import a script of ``benchmarks/`` as a module (the scripts are not a package), for the tests of its functions."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(script: str, module_name: str | None = None) -> ModuleType:
    """Execute ``benchmarks/<script>.py`` as module ``module_name`` (default: the script's name), registered in
    ``sys.modules`` so that its dataclasses and pickling resolve."""
    spec = importlib.util.spec_from_file_location(module_name or script, BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
