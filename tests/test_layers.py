"""The package's layers import downwards only: a module never imports a package above its own.

Order, lowest first (a package may import its own layer and any layer to its left):
utils < algorithms < rollout < data < models < engines < config < reproduce < zoo < actors < trainer < cli.
The check reads every module's import statements (top-level and inside functions) with ``ast``.
"""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "openrlhf_hacpo"
LAYERS = ["utils", "algorithms", "rollout", "data", "models", "engines", "config", "reproduce", "zoo", "actors",
          "trainer", "cli"]


def layer_of(module: str) -> str | None:
    """``openrlhf_hacpo.<layer>[...]`` -> ``<layer>``; other modules -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "openrlhf_hacpo" and len(parts) > 1 else None


def imported_modules(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.append(node.module)
    return found


def test_every_layer_is_listed():
    present = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert present == set(LAYERS), f"layers not in LAYERS: {present - set(LAYERS)}; gone: {set(LAYERS) - present}"


def test_imports_point_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        for module in imported_modules(path):
            target = layer_of(module)
            if target and LAYERS.index(target) > LAYERS.index(own):
                upward.append(f"{path.relative_to(PACKAGE.parent)} ({own}) imports {module} ({target})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """Relative imports are resolved, so ``from ..trainer import x`` inside actors/ would be caught."""
    fake = tmp_path / "openrlhf_hacpo" / "actors" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..trainer.checkpoint import CheckpointManager\nimport openrlhf_hacpo.cli.train_hacpo\n"
                    "from . import policy\n")
    found = imported_modules(fake, tmp_path / "openrlhf_hacpo")
    assert found == ["openrlhf_hacpo.trainer.checkpoint", "openrlhf_hacpo.cli.train_hacpo", "openrlhf_hacpo.actors"]
    assert [layer_of(m) for m in found] == ["trainer", "cli", "actors"]
