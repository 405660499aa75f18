"""No import circles inside ``openrlhf_hacpo``: the module graph is acyclic.

Every module of the package is parsed with ``ast`` and each import statement becomes an edge, wherever it stands: at
the top, inside a function, or under ``if TYPE_CHECKING:`` (a circle through type-only imports is still a circle of
the design). ``import a.b`` points at ``a.b``; ``from a import b`` points at the module ``a.b`` when there is one,
else at ``a`` (its ``__init__``); relative imports are resolved against the importing module's package. Importing a
module runs its parent packages' ``__init__`` too; those implicit imports are not edges (every package would
otherwise sit on a circle with its own submodules). ``tests/test_layers.py`` keeps the packages in layers; this test
keeps the modules inside a package apart.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "openrlhf_hacpo"


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """``root/actors/policy.py`` -> ``<root name>.actors.policy``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (see the module docstring for what counts)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in paths}

    def resolve(name: str) -> str | None:
        """The longest prefix of dotted ``name`` that is a module of the package."""
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in graph:
                return ".".join(parts[:end])
        return None

    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: level 1 is the module's own package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in graph else base
                           for alias in node.names]
            for target in targets:
                resolved = resolve(target)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: in each strongly connected group of more than one module (Tarjan), a shortest circle
    through each of its modules, as the module names in import order from the circle's first name (alphabetically)
    with that name repeated at the end; without repeats, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = set()
    for group in groups:
        for start in group:
            circle = _circle_through(graph, group, start)[:-1]
            first = circle.index(min(circle))
            found.add(tuple(circle[first:] + circle[:first] + [circle[first]]))
    return sorted(list(c) for c in found)


def _circle_through(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest circle from ``start`` back to it within its strongly connected group (breadth-first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a strongly connected group always has one


def test_the_package_has_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_sees_circles(tmp_path):
    """A circle through a relative import, a function-level import and a ``TYPE_CHECKING`` import is found and named;
    a package importing its own submodule, and a module importing a name from its package, are not circles."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from pkg.a import f\n")
    (root / "a.py").write_text("from . import b\ndef f():\n    return b\n")
    (root / "b.py").write_text("def g():\n    from pkg.sub import c\n    return c\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n")
    (root / "d.py").write_text("import pkg.sub.c\nfrom pkg import a\nfrom pkg.sub import nothing_here\n")
    graph = import_graph(root)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": set(),
                     "pkg.sub.c": {"pkg.a"}, "pkg.d": {"pkg.sub.c", "pkg.a", "pkg.sub"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (root / "sub" / "c.py").write_text("X = 1\n")
    assert cycles(import_graph(root)) == []
