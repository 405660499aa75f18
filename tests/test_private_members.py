"""No module of ``openrlhf_hacpo`` or ``kernels`` reaches into another object's or module's underscored members.

A member is the package's own private one when the package defines it: ``def _name`` or ``_name = ...`` at a module's
top level or in a class body, or ``self._name = ...`` in a method. Reading ``something._name`` for such a name is
allowed only on ``self``, ``cls`` or ``super()`` (a class using its own or its base's members). Underscored members of third-party objects
(DeepSpeed's checkpoint naming, ``argparse``, ``ray._private``) are not the package's seams and are not checked here.
Public seams keep a learner's pieces (``UpdateLoop``, its first-update path, the zero-gradient probe) replaceable
one at a time; ``tests/test_import_cycles.py`` keeps them free of import circles.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "openrlhf_hacpo", ROOT / "kernels")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_private_names(trees: dict[pathlib.Path, ast.Module]) -> set[str]:
    """Underscored names the code defines: module- and class-level functions and assignments, ``self._x = ...``."""
    names: set[str] = set()
    for tree in trees.values():
        scopes = [tree] + [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
        for scope in scopes:
            for node in scope.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
                    names.add(node.name)
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                names.update(t.id for t in targets if isinstance(t, ast.Name) and _private(t.id))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return names


def foreign_private_reads(trees: dict[pathlib.Path, ast.Module]) -> list[str]:
    """``path:line: expression`` for each ``x._name`` with ``_name`` the code's own and ``x`` not self, cls or super()."""
    own = defined_private_names(trees)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in own):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super":
                continue  # an override calling the member it overrides
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def parse(sources: dict[pathlib.Path, str]) -> dict[pathlib.Path, ast.Module]:
    return {path: ast.parse(text, filename=str(path)) for path, text in sources.items()}


def package_sources() -> dict[pathlib.Path, str]:
    return {p: p.read_text(encoding="utf-8") for package in PACKAGES for p in sorted(package.rglob("*.py"))}


def test_no_module_reads_another_objects_private_members():
    assert foreign_private_reads(parse(package_sources())) == []


def test_the_reader_sees_a_planted_reach_into_a_private_member():
    sources = package_sources()
    loop = ROOT / "openrlhf_hacpo" / "actors" / "update_loop.py"
    probe = ROOT / "openrlhf_hacpo" / "actors" / "zero_grad_probe.py"
    assert loop in sources and probe in sources
    sources[loop] += "\n\nclass _Planted:\n    def __init__(self):\n        self._planted_state = 0\n"
    sources[probe] += "\n\ndef _reach(loop):\n    return loop._planted_state\n"
    found = foreign_private_reads(parse(sources))
    assert len(found) == 1 and "zero_grad_probe.py" in found[0] and "loop._planted_state" in found[0]
