"""The package's allowed-dependency map: which top-level packages of ``openrlhf_hacpo`` each one may import.

The training core is layered (a package imports only packages below it); the two applications, ``zoo/`` (the tiny
agents and the tiny main job) and ``reproduce/`` (the paper's benchmarks and tables), sit beside the core: they may
use any of it, the core never imports them, they never import each other, and only ``cli/`` (the commands) imports
them. ``docs/design.md`` draws this map. The check reads every module's import statements (top-level and inside
functions) with ``ast``; ``kernels/`` (installed as ``hacpo_kernels``) imports nothing from ``openrlhf_hacpo``.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "openrlhf_hacpo"
KERNELS = ROOT / "kernels"

CORE = ["utils", "algorithms", "rollout", "data", "models", "engines", "config", "actors", "trainer"]
APPLICATIONS = ["zoo", "reproduce"]
ALLOWED: dict[str, set[str]] = {
    "utils": set(),
    "algorithms": {"utils"},
    "rollout": {"utils", "algorithms"},  # a learner batch builds the loss input (algorithms.PolicyLossInput)
    "data": {"utils", "rollout"},
    "models": {"utils"},
    "engines": {"utils", "models"},  # the HF engine actor loads its tokenizer as a policy does
    "config": {"utils", "algorithms", "rollout", "models"},
    "actors": {"utils", "algorithms", "rollout", "models", "engines", "config"},
    "trainer": {"utils", "algorithms", "rollout", "data", "models", "engines", "config", "actors"},
    "zoo": set(CORE),
    "reproduce": set(CORE),
    "cli": set(CORE) | set(APPLICATIONS),
}


def layer_of(module: str) -> str | None:
    """``openrlhf_hacpo.<package>[...]`` -> ``<package>``; other modules -> None."""
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


def forbidden_imports(root: pathlib.Path = PACKAGE, allowed: dict[str, set[str]] = ALLOWED) -> list[str]:
    """Every import under ``root`` of a package that the importing package's entry of ``allowed`` leaves out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        own = path.relative_to(root).parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        for module in imported_modules(path, root):
            target = layer_of(module)
            if target and target != own and target not in allowed[own]:
                found.append(f"{path.relative_to(root.parent)} ({own}) imports {module} ({target})")
    return found


def test_every_package_is_in_the_map():
    present = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert present == set(ALLOWED), f"not in ALLOWED: {present - set(ALLOWED)}; gone: {set(ALLOWED) - present}"
    assert set(CORE) | set(APPLICATIONS) | {"cli"} == set(ALLOWED)


def test_imports_follow_the_map():
    found = forbidden_imports()
    assert not found, "imports the dependency map does not allow:\n" + "\n".join(found)


def test_the_map_has_no_cycle_and_applications_sit_beside_the_core():
    order, left = [], dict(ALLOWED)
    while left:  # peel off the packages whose dependencies are all placed
        ready = sorted(name for name, deps in left.items() if deps <= set(order))
        assert ready, f"a cycle among {sorted(left)}"
        order += ready
        for name in ready:
            del left[name]
    for app in APPLICATIONS:
        importers = sorted(name for name, deps in ALLOWED.items() if app in deps)
        assert importers == ["cli"], f"{app} is imported by {importers}"
    assert all(ALLOWED[name] <= set(CORE) for name in CORE)  # the core stands without the applications


def test_kernels_import_nothing_from_the_package():
    found = [f"{path.relative_to(ROOT)} imports {module}" for path in sorted(KERNELS.rglob("*.py"))
             for module in imported_modules(path, KERNELS) if layer_of(module) or module == "openrlhf_hacpo"]
    assert not found, "\n".join(found)


def test_the_check_sees_a_forbidden_import(tmp_path):
    """Relative imports are resolved, so ``from ..zoo import x`` inside trainer/ is caught, and an import the map
    allows is not reported."""
    root = tmp_path / "openrlhf_hacpo"
    fake = root / "trainer" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..zoo.job import run_main_job\nimport openrlhf_hacpo.cli.train_hacpo\n"
                    "from . import controller\nfrom openrlhf_hacpo.actors import policy\n")
    (root / "models").mkdir()
    (root / "models" / "logprobs.py").write_text("def f():\n    from openrlhf_hacpo.rollout import LearnerBatch\n")
    found = imported_modules(fake, root)
    assert found == ["openrlhf_hacpo.zoo.job", "openrlhf_hacpo.cli.train_hacpo", "openrlhf_hacpo.trainer",
                     "openrlhf_hacpo.actors"]
    assert forbidden_imports(root) == [
        "openrlhf_hacpo/models/logprobs.py (models) imports openrlhf_hacpo.rollout (rollout)",
        "openrlhf_hacpo/trainer/fake.py (trainer) imports openrlhf_hacpo.zoo.job (zoo)",
        "openrlhf_hacpo/trainer/fake.py (trainer) imports openrlhf_hacpo.cli.train_hacpo (cli)",
    ]
