"""tests/schedule.py: the files it lists exist, and its order puts them first, the most expensive first, and the
LAST files at the end, with every test kept and the order within a file and among unlisted files unchanged."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import schedule

REPO = Path(__file__).resolve().parents[1]


def test_every_listed_file_exists():
    missing = [path for path in (*schedule.COST_S, *schedule.LAST) if not (REPO / path).is_file()]
    assert not missing, f"tests/schedule.py lists files that do not exist: {missing}"


def test_listed_files_go_first_the_most_expensive_first(monkeypatch):
    monkeypatch.setattr(schedule, "COST_S", {"tests/b.py": 10.0, "tests/d.py": 50.0})
    ids = ["tests/a.py::x", "tests/b.py::one", "tests/c.py::y", "tests/b.py::two", "tests/d.py::z", "tests/e.py::w"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    schedule.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["tests/d.py::z", "tests/b.py::one", "tests/b.py::two", "tests/a.py::x",
                                         "tests/c.py::y", "tests/e.py::w"]


def test_last_files_go_after_every_other(monkeypatch):
    monkeypatch.setattr(schedule, "COST_S", {"tests/b.py": 10.0})
    monkeypatch.setattr(schedule, "LAST", ("tests/a.py",))
    ids = ["tests/a.py::x", "tests/c.py::y", "tests/a.py::z", "tests/b.py::one"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    schedule.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["tests/b.py::one", "tests/c.py::y", "tests/a.py::x", "tests/a.py::z"]
