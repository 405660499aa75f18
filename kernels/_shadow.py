"""Hand ``import kernels`` over to the installed package of that name when this folder is found by accident.

This folder installs as ``hacpo_kernels``; its directory name is ``kernels`` only because the repository layout
names it so. When the repository root is on ``sys.path`` (a script run from a checkout), a plain ``import kernels``
(for example transformers probing for the Hugging Face ``kernels`` package) would load this folder instead. The
package's ``__init__`` then calls :func:`hand_over`, which loads the next ``kernels`` on ``sys.path`` that is not
this folder and puts it in ``sys.modules``, so the import statement returns the real package.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def hand_over(init_file: str) -> None:
    """Replace ``sys.modules["kernels"]`` by the next package called ``kernels`` on ``sys.path``.

    Raises:
        ImportError: no other ``kernels`` package is installed (the message names ``hacpo_kernels``).
    """
    here = os.path.realpath(os.path.dirname(os.path.dirname(init_file)))
    search = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("kernels", search)
    if spec is None or spec.loader is None:
        raise ImportError(
            "no module named 'kernels' is installed; the folder kernels/ of openrlhf-hacpo is imported as "
            "'hacpo_kernels'", name="kernels")
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("kernels._shadow", None)  # this helper must not stay a submodule of the other package
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("kernels", None)
        raise
