"""Reward functions: which function a reward name means, as a picklable :class:`RewardFunction`.

Two kinds of reward function share one calling convention, ``fn(responses, prompts, labels) -> list[float]``:

* **registered verifiers** score one sample at a time, ``verifier(response_text, label) -> float``:
  ``exact_match``, ``boxed_math`` (:mod:`openrlhf_hacpo.rollout.verifiers`), ``boxed_exact``
  (:mod:`openrlhf_hacpo.rollout.math_reward`) and ``arithmetic`` (the shipped arithmetic task), each imported on
  first use;
* **reward files** in OpenRLHF's style: a Python file defining ``reward_func(queries, prompts, labels)`` where
  ``queries[i] = prompts[i] + responses[i]``, returning a list or 1-D tensor of floats, or a dict whose
  ``"rewards"`` entry is one. ``FILE.py:NAME`` uses the function ``NAME`` of the file instead of ``reward_func``.

:func:`reward_spec_problem` checks a reward name without importing anything (a registered name, or an existing
``.py`` file whose source parses and defines the function at top level); the config checks ``--reward_fn`` with it
when the command line is parsed, :func:`get_reward_fn` imports the file later.

:class:`RewardFunction` holds only names and paths, so it pickles into worker processes;
:class:`~openrlhf_hacpo.rollout.reward_runner.RewardRunner` runs it.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import keyword
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "get_reward_fn",
    "register_reward_fn",
    "registered_reward_fns",
    "reward_spec_problem",
]


class RewardFunctionError(RuntimeError):
    """A reward function could not be loaded, raised, or returned something that is not one float per sample."""


# ------------------------------------------------------------------------------------------- registered verifiers
_REGISTRY: dict[str, str] = {
    "exact_match": "openrlhf_hacpo.rollout.verifiers:exact_match",
    "boxed_math": "openrlhf_hacpo.rollout.verifiers:boxed_math",
    "boxed_exact": "openrlhf_hacpo.rollout.math_reward:boxed_exact",
    "arithmetic": "openrlhf_hacpo.data.arithmetic:arithmetic_reward",
}


def register_reward_fn(name: str, fn: Callable[[str, Any], float] | str) -> None:
    """Register a per-sample verifier ``fn(response_text, label) -> float`` under ``name``.

    ``fn`` is a module-level function or a ``"module:attribute"`` string; it is stored by reference so worker
    processes can import it.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    if callable(fn):
        target = f"{fn.__module__}:{fn.__qualname__}"
        if "<" in fn.__qualname__ or fn.__module__ == "__main__":
            raise ValueError(
                f"reward {name!r}: {fn.__qualname__} must be a module-level function of an importable module"
            )
    else:
        target = fn
    _resolve_target(target, name)
    _REGISTRY[name] = target


def registered_reward_fns() -> list[str]:
    return sorted(_REGISTRY)


def _resolve_target(target: str, name: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise RewardFunctionError(f"reward {name!r}: cannot import {target!r} ({type(err).__name__}: {err})") from err
    if not callable(obj):
        raise RewardFunctionError(f"reward {name!r}: {target!r} is not callable")
    return obj


# ------------------------------------------------------------------------------------------- reward files
REWARD_FILE_FUNCTION = "reward_func"
"""The function a reward file must define when its name carries no ``:NAME``."""

_FILE_MODULES: dict[tuple[str, int], Any] = {}


def split_reward_file(spec: str) -> tuple[str, str] | None:
    """``"r.py"`` -> ``("r.py", "reward_func")``, ``"r.py:score"`` -> ``("r.py", "score")``; None when ``spec`` is not
    of the form ``FILE.py`` or ``FILE.py:NAME``."""
    if spec.endswith(".py"):
        return spec, REWARD_FILE_FUNCTION
    path, sep, function = spec.rpartition(":")
    if sep and path.endswith(".py") and function.isidentifier() and not keyword.iskeyword(function):
        return path, function
    return None


_BLOCKS = (ast.If, ast.Try, ast.With, ast.ExceptHandler, *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))


def _top_level_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """Names bound by the module-level statements of ``body`` (descending into if / try / with blocks), and whether
    a ``from ... import *`` makes the set incomplete."""
    names: set[str] = set()
    star = False
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        if isinstance(node, _BLOCKS):
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner, inner_star = _top_level_names(getattr(node, block, []))
                names |= inner
                star = star or inner_star
    return names, star


def _known_forms() -> str:
    return (f"a registered verifier ({', '.join(registered_reward_fns())}) or a reward file FILE.py defining "
            f"{REWARD_FILE_FUNCTION}(queries, prompts, labels), or FILE.py:FUNCTION")


def reward_spec_problem(spec: Any) -> str | None:
    """Why ``spec`` names no reward function, or None when it does: a registered verifier, or an existing ``.py`` file
    (``FILE.py`` or ``FILE.py:FUNCTION``) whose source parses and binds the function at module level. Nothing is
    imported; :func:`get_reward_fn` imports the file."""
    if not isinstance(spec, str) or not spec:
        return f"expected {_known_forms()}; got {spec!r}"
    if spec in _REGISTRY:
        return None
    parts = split_reward_file(spec)
    if parts is None:
        return f"unknown reward {spec!r}: expected {_known_forms()}"
    path, function = parts
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        return f"reward file {path} does not exist (expected {_known_forms()})"
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except SyntaxError as err:
        return f"reward file {path}:{err.lineno}: invalid Python ({err.msg})"
    except (OSError, ValueError) as err:
        return f"reward file {path} cannot be read as Python source ({type(err).__name__}: {err})"
    names, star = _top_level_names(tree.body)
    if function not in names and not star:
        return f"reward file {path} does not define a function {function}(queries, prompts, labels) at module level"
    return None


def _load_reward_file(path: str, function: str = REWARD_FILE_FUNCTION) -> Callable[..., Any]:
    """Import a reward file (cached per process and modification time) and return its ``function``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"reward file {path} does not exist")
    key = (path, os.stat(path).st_mtime_ns)
    module = _FILE_MODULES.get(key)
    if module is None:
        name = "hacpo_reward_file_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RewardFunctionError(f"reward file {path} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:
            raise RewardFunctionError(f"importing reward file {path} failed: {type(err).__name__}: {err}") from err
        _FILE_MODULES[key] = module
    fn = getattr(module, function, None)
    if not callable(fn):
        raise RewardFunctionError(
            f"reward file {path} does not define a function {function}(queries, prompts, labels)"
        )
    return fn


def _as_float_list(out: Any, n: int, who: str) -> list[float]:
    if isinstance(out, dict):
        if "rewards" not in out:
            raise RewardFunctionError(f"{who} returned a dict without a 'rewards' entry (keys: {list(out)})")
        out = out["rewards"]
    if callable(getattr(out, "tolist", None)):
        try:
            out = out.tolist()
        except Exception as err:
            raise RewardFunctionError(f"{who} returned a {type(out).__name__} whose tolist() raised "
                                      f"{type(err).__name__}: {err}") from err
    if not isinstance(out, (list, tuple)):
        raise RewardFunctionError(f"{who} must return a list or 1-D tensor of floats, got {type(out).__name__}")
    if len(out) != n:
        raise RewardFunctionError(f"{who} returned {len(out)} rewards for {n} samples")
    values = []
    for i, v in enumerate(out):
        if not isinstance(v, numbers.Real):
            raise RewardFunctionError(f"{who} returned a non-numeric reward {_short_repr(v)} for sample {i}")
        try:
            v = float(v)
        except (OverflowError, ValueError, TypeError) as err:
            raise RewardFunctionError(f"{who} returned a reward {_short_repr(v)} for sample {i} that is not a "
                                      f"float ({type(err).__name__}: {err})") from None
        if not math.isfinite(v):
            raise RewardFunctionError(f"{who} returned a non-finite reward {v} for sample {i}")
        values.append(v)
    return values


def _short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (an object whose repr fails is named by its type)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user object with a broken __repr__
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class RewardFunction:
    """A picklable handle on a registered verifier (``target``) or a reward file (``path``, whose ``function`` is
    called)."""

    name: str
    target: str | None = None
    path: str | None = None
    function: str = REWARD_FILE_FUNCTION

    def __post_init__(self) -> None:
        if (self.target is None) == (self.path is None):
            raise ValueError("RewardFunction needs exactly one of target (registered verifier) or path (reward file)")

    def __call__(self, responses: Sequence[str], prompts: Sequence[str], labels: Sequence[str | None]) -> list[float]:
        n = len(responses)
        if len(prompts) != n or len(labels) != n:
            raise ValueError(f"reward {self.name!r}: {n} responses, {len(prompts)} prompts, {len(labels)} labels")
        if self.path is not None:
            fn = _load_reward_file(self.path, self.function)
            queries = [p + r for p, r in zip(prompts, responses)]
            try:
                out = fn(queries, list(prompts), list(labels))
            except (Exception, SystemExit) as err:
                raise RewardFunctionError(
                    f"{self.function} in {self.path} raised {type(err).__name__}: {err}"
                ) from err
            return _as_float_list(out, n, f"{self.function} in {self.path}")
        fn = _resolve_target(self.target, self.name)
        values = []
        for i, (response, label) in enumerate(zip(responses, labels)):
            try:
                values.append(fn(response, label))
            except (Exception, SystemExit) as err:
                raise RewardFunctionError(
                    f"reward {self.name!r} raised {type(err).__name__} on sample {i}: {err}"
                ) from err
        return _as_float_list(values, n, f"reward {self.name!r}")


def get_reward_fn(name_or_path: str | RewardFunction) -> RewardFunction:
    """A registered verifier by name, or a reward file ``FILE.py`` / ``FILE.py:FUNCTION`` (imported now, and checked
    for the function)."""
    if isinstance(name_or_path, RewardFunction):
        return name_or_path
    if name_or_path in _REGISTRY:
        _resolve_target(_REGISTRY[name_or_path], name_or_path)
        return RewardFunction(name=name_or_path, target=_REGISTRY[name_or_path])
    parts = split_reward_file(str(name_or_path))
    if parts is None:
        raise ValueError(f"unknown reward {name_or_path!r}: expected {_known_forms()}")
    path, function = str(Path(parts[0]).expanduser().resolve()), parts[1]
    _load_reward_file(path, function)
    name = path if function == REWARD_FILE_FUNCTION else f"{path}:{function}"
    return RewardFunction(name=name, path=path, function=function)
