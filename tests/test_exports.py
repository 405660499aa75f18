"""Every name a module of the package lists in ``__all__`` exists (a moved or renamed function leaves none behind)."""
import importlib
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "openrlhf_hacpo"


def test_every_exported_name_exists():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__all__" not in path.read_text():
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in getattr(module, "__all__", []) if not hasattr(module, n)]
    assert not missing, f"__all__ names that do not exist: {missing}"
