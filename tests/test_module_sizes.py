"""No package module over 500 lines and no class over 300: a module or class past that holds more than one job
(docs/design.md, "Modules and their one job"), so it is split where its jobs separate."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("openrlhf_hacpo", "kernels")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def oversized(root: Path) -> list[str]:
    """``path: N lines`` for every module over the limit and ``path: class C, N lines`` for every class over it."""
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        name = path.relative_to(root.parent)
        if lines > MAX_MODULE_LINES:
            out.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                out.append(f"{name}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    return out


def test_no_module_over_500_lines_and_no_class_over_300():
    found = [line for package in PACKAGES for line in oversized(REPO / package)]
    assert not found, "split these where their jobs separate:\n" + "\n".join(found)


def test_the_check_sees_a_long_module_and_a_long_class(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "wide.py").write_text("class Wide:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert oversized(package) == [f"pkg/long.py: {MAX_MODULE_LINES + 1} lines",
                                  f"pkg/wide.py: class Wide, {MAX_CLASS_LINES + 1} lines"]
