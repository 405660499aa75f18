"""The kernels/ folder installs as ``hacpo_kernels`` and coexists with a package called ``kernels``.

The Hugging Face ``kernels`` package (probed for by transformers) has the import name ``kernels``. The test builds a
stand-in package of that name with its own dist-info in a temporary site folder and imports both in one process,
once from a neutral working directory and once from the repository root, where the folder ``kernels/`` is on
``sys.path`` first.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHECK = (
    "import kernels, hacpo_kernels, sys\n"
    "assert kernels.WHO == 'the other kernels package', kernels.__file__\n"
    "assert hasattr(hacpo_kernels, 'hacpo_loss') and hacpo_kernels.__file__.endswith('kernels/__init__.py')\n"
    "assert 'kernels._shadow' not in sys.modules\n"
    "print('ok', kernels.__file__, hacpo_kernels.__file__)\n"
)


@pytest.fixture()
def other_kernels(tmp_path: pathlib.Path) -> pathlib.Path:
    site = tmp_path / "site"
    pkg = site / "kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("WHO = 'the other kernels package'\n")
    dist = site / "kernels-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.0.1\n")
    return site


@pytest.mark.parametrize("cwd", ["neutral", "repo_root"])
@pytest.mark.integration
def test_both_packages_import_side_by_side(other_kernels: pathlib.Path, tmp_path: pathlib.Path, cwd: str):
    # the stand-in goes after whatever makes hacpo_kernels importable here (an install, or a link on PYTHONPATH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(other_kernels)]))
    workdir = ROOT if cwd == "repo_root" else tmp_path
    # `python -c` puts the working directory first on sys.path, as a script run from a checkout would
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


@pytest.mark.integration
def test_without_the_other_package_kernels_is_an_empty_module_and_transformers_sees_none():
    code = ("import kernels, hacpo_kernels\n"
            "assert kernels.__file__ is None and not hasattr(kernels, '__version__')\n"
            "try:\n    kernels.get_kernel\nexcept AttributeError as err:\n    assert 'hacpo_kernels' in str(err)\n"
            "else:\n    raise SystemExit('attribute access should fail')\n"
            "from transformers.utils import is_kernels_available\n"
            "assert not is_kernels_available()\n"
            "assert hasattr(hacpo_kernels, 'fused_linear_logprobs')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
