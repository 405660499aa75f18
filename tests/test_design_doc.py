"""docs/design.md's dependency table says what tests/test_layers.py enforces: the same packages, the same allowed
imports (read from the table's markdown rows, groups such as "any core package" expanded)."""
import pathlib
import re

from test_layers import ALLOWED, APPLICATIONS, CORE

DESIGN = pathlib.Path(__file__).resolve().parents[1] / "docs" / "design.md"


def documented_map(text: str) -> dict[str, set[str]]:
    """``{package: packages it may import}`` from the table after "Exactly, package → packages it may import"."""
    table = text.split("Exactly, package → packages it may import", 1)[1]
    lines = table.splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start + 2:end]  # the table's rows, without its header and rule
    out: dict[str, set[str]] = {}
    for row in rows:
        left, right = [cell.strip() for cell in row.strip("|").split("|")][:2]
        packages = re.findall(r"`([a-z_]+)`", left)
        if right.startswith("nothing"):
            allowed: set[str] = set()
        elif right.startswith("everything"):
            allowed = set(CORE) | set(APPLICATIONS)
        elif right.startswith("any core package"):
            allowed = set(CORE)
        else:
            allowed = set(re.findall(r"`([a-z_]+)`", right.split("(")[0]))
        for package in packages:
            out[package] = allowed
    return out


def test_the_design_doc_table_is_the_enforced_map():
    assert documented_map(DESIGN.read_text(encoding="utf-8")) == ALLOWED


def test_the_reader_sees_a_wrong_row():
    text = DESIGN.read_text(encoding="utf-8").replace("| `engines` | `utils`, `models`", "| `engines` | `utils`")
    assert documented_map(text)["engines"] != ALLOWED["engines"]
