"""A Python that sees only what a locked-down GPU node has: torch, Triton, transformers, numpy, pytest and the
packages they require (no DeepSpeed, Ray, vLLM, accelerate, ...), made from this interpreter's site-packages.

``restricted_python(tmp)`` writes a folder of links to those packages and a launcher script that runs this
interpreter without its site-packages (``-S``) and with that folder on its path; use it as ``PYTHON`` for the shell
scripts."""
from __future__ import annotations

import importlib.metadata as md
import os
import re
import stat
import sys
from pathlib import Path

GPU_IMAGE = ("torch", "triton", "transformers", "numpy", "pytest")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(dist: md.Distribution) -> list[str]:
    names = []
    for requirement in dist.requires or []:
        name, _, marker = requirement.partition(";")
        if "extra ==" in marker or "win32" in marker or "Windows" in marker:
            continue
        names.append(re.split(r"[ <>=!~\[(]", name.strip(), maxsplit=1)[0])
    return names


def image_distributions(roots=GPU_IMAGE) -> list[md.Distribution]:
    """The installed distributions of ``roots`` and of everything they require (extras left out)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if _norm(name) in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[_norm(name)] = dist
        todo.extend(_requirements(dist))
    return list(seen.values())


def restricted_python(root: Path) -> Path:
    """Write ``root/site`` (links to the image's packages) and ``root/python`` (the launcher); returns the
    launcher."""
    site = root / "site"
    site.mkdir(parents=True, exist_ok=True)
    for dist in image_distributions():
        for item in dist.files or []:
            top = item.parts[0]
            if top == ".." or top.endswith(".data") or top == "__pycache__":
                continue
            source, target = Path(dist.locate_file(top)), site / top
            if source.exists() and not target.exists():
                os.symlink(source, target)
    launcher = root / "python"
    launcher.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec "{sys.executable}" -S "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return launcher
