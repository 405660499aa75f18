"""The Python embedded in the shell scripts (``examples/scripts/*.sh``, ``benchmarks/*.sh``) is code too: every
``from X import Y`` / ``import X`` in it must resolve against the package as it is now (a name that moved makes a
GPU run fail at its last step), and the smoke runs' final summary must work on a small ``metrics.jsonl``.

Python is found where the scripts run it: heredocs fed to a Python command (``"$PY" - ... <<'PY'``) and ``-c "..."``
strings."""
from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("examples/scripts/*.sh"), *REPO.glob("benchmarks/*.sh")])
PYTHON_COMMAND = re.compile(r'("\$PY"|\$PY\b|\$\{?PYTHON|python3?\b)')
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
DASH_C = re.compile(r'-c\s+"((?:[^"\\]|\\.)*)"')


def embedded_python(script: Path) -> list[tuple[int, str]]:
    """(line number, code) of every Python snippet of a shell script."""
    lines = script.read_text(encoding="utf-8").splitlines()
    found = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if PYTHON_COMMAND.search(line):
            for match in DASH_C.finditer(line):
                found.append((index + 1, match.group(1).replace('\\"', '"').replace("\\$", "$")))
            heredoc = HEREDOC.search(line)
            if heredoc and "<<<" not in line:
                end = heredoc.group(1)
                body = []
                index += 1
                while index < len(lines) and lines[index].strip() != end:
                    body.append(lines[index])
                    index += 1
                found.append((index - len(body) + 1, "\n".join(body)))
        index += 1
    return found


def _imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) of each ``from module import name`` and (module, None) of each ``import module``."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            out.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
    return out


SNIPPETS = [(script, line, code) for script in SCRIPTS for line, code in embedded_python(script)]


def test_the_scripts_have_embedded_python_to_check():
    names = {script.name for script, _, _ in SNIPPETS}
    assert {"smoke_2gpu.sh", "gpu_check.sh", "gpu_train_check.sh"} <= names


@pytest.mark.parametrize("script, line, code", SNIPPETS,
                         ids=[f"{s.relative_to(REPO)}:{n}" for s, n, _ in SNIPPETS])
def test_embedded_imports_resolve(script, line, code):
    unresolved = []
    for module_name, name in _imports(code):
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            unresolved.append(f"import {module_name}: {err}")
            continue
        if name is None or name == "*" or hasattr(module, name):
            continue
        try:
            importlib.import_module(f"{module_name}.{name}")
        except ImportError:
            unresolved.append(f"from {module_name} import {name}: {module_name} has no {name!r}")
    assert not unresolved, f"{script.relative_to(REPO)} line {line}: " + "; ".join(unresolved)


def _smoke_summary() -> str:
    snippets = [code for _, code in embedded_python(REPO / "examples/scripts/smoke_2gpu.sh") if "metrics.jsonl" in code]
    assert len(snippets) == 1, "smoke_2gpu.sh should end with one summary of metrics.jsonl"
    return snippets[0]


def _run_summary(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", str(out), "smoke_test"], input=_smoke_summary(), text=True,
                          capture_output=True, cwd=REPO, timeout=120)


@pytest.mark.integration
def test_the_smoke_summary_reads_a_metrics_file(tmp_path):
    records = [{"step": s, "agent": "llama32", "loss": 0.5 / s, "updates": 1} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = _run_summary(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "smoke_test: step 3 agent llama32: loss 0.1667, updates 1" in done.stdout
    assert done.stdout.strip().endswith("smoke_test: steps 1-3 logged, resume and evaluation done")


@pytest.mark.integration
def test_the_smoke_summary_fails_on_missing_steps(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "agent": "a"}\n{"step": 2, "agent": "a"}\n')
    done = _run_summary(tmp_path)
    assert done.returncode != 0
    assert "smoke_test: metrics.jsonl holds steps [1, 2], expected [1, 2, 3]" in done.stderr
