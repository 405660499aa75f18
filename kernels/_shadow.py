"""Hand ``import kernels`` over to the installed package of that name when this folder is found by accident.

This folder installs as ``hacpo_kernels``; its directory name is ``kernels`` only because the repository layout
names it so. When the repository root is on ``sys.path`` (a script run from a checkout), a plain ``import kernels``
(for example transformers probing for the Hugging Face ``kernels`` package) would load this folder instead. The
package's ``__init__`` then calls :func:`hand_over`, which loads the next ``kernels`` on ``sys.path`` that is not
this folder and puts it in ``sys.modules``, so the import statement returns the real package. When no other
``kernels`` is installed, the module is left empty, like a namespace package (``__file__`` is ``None``, no
``__version__``, no submodules): transformers' availability probe then reports the package as absent, and any
attribute access raises an error that names ``hacpo_kernels``.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def hand_over(init_file: str, namespace: dict) -> None:
    """Replace ``sys.modules["kernels"]`` by the next package called ``kernels`` on ``sys.path``, or empty
    ``namespace`` (the module's globals) when there is none."""
    here = os.path.realpath(os.path.dirname(os.path.dirname(init_file)))
    search = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("kernels", search)
    sys.modules.pop("kernels._shadow", None)  # this helper must not stay a submodule of any "kernels" package
    if spec is None or spec.loader is None:
        namespace["__file__"] = None
        namespace["__path__"] = []
        namespace["__getattr__"] = _absent
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("kernels", None)
        raise


def _absent(name: str):
    raise AttributeError(f"module 'kernels' has no attribute {name!r}: no package called 'kernels' is installed "
                         "(the folder kernels/ of openrlhf-hacpo is imported as 'hacpo_kernels')")
