"""Verifiable rewards: built-in verifiers, OpenRLHF-style reward files, and a process-pool runner.

A reward is computed once per trajectory, from the source agent's own response text, and reused by every learner, as in
the official code.

Two kinds of reward function share one calling convention, ``fn(responses, prompts, labels) -> list[float]``:

* **registered verifiers** score one sample at a time, ``verifier(response_text, label) -> float``:
  ``exact_match``, ``boxed_math`` and ``arithmetic`` (the shipped arithmetic task, imported on first use);
* **reward files** in OpenRLHF's style: a Python file defining ``reward_func(queries, prompts, labels)`` where
  ``queries[i] = prompts[i] + responses[i]``, returning a list or 1-D tensor of floats, or a dict whose
  ``"rewards"`` entry is one. ``FILE.py:NAME`` uses the function ``NAME`` of the file instead of ``reward_func``.

:func:`reward_spec_problem` checks a reward name without importing anything (a registered name, or an existing
``.py`` file whose source parses and defines the function at top level); the config checks ``--reward_fn`` with it
when the command line is parsed, :func:`get_reward_fn` imports the file later.

:class:`RewardFunction` holds only names and paths, so it pickles into worker processes; :class:`RewardRunner`
scores in a spawn-context process pool, or in the calling process, with an overall timeout either way.
"""
from __future__ import annotations

import ast
import concurrent.futures as cf
import hashlib
import importlib
import importlib.util
import keyword
import math
import multiprocessing
import os
import numbers
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable, Sequence

from openrlhf_hacpo.rollout.math_reward import closing_brace

__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "RewardRunner",
    "RewardTimeoutError",
    "boxed_math",
    "exact_match",
    "get_reward_fn",
    "last_boxed_content",
    "normalize_answer",
    "prompt_text_for_reward",
    "register_reward_fn",
    "registered_reward_fns",
    "reward_spec_problem",
]


class RewardFunctionError(RuntimeError):
    """A reward function could not be loaded, raised, or returned something that is not one float per sample."""


class RewardTimeoutError(RewardFunctionError, TimeoutError):
    """The reward function did not score a batch within the runner's timeout."""


# ------------------------------------------------------------------------------------------- built-in verifiers
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer: stripped; a number loses thousands commas, ``+`` and trailing zeros.

    ``" 1,000.0 "`` → ``"1000"``, ``"42."`` → ``"42"``, ``"-0.50"`` → ``"-0.5"``; non-numbers are only stripped.
    """
    s = str(text).strip()
    candidate = s.replace(",", "")
    if _NUMBER.match(candidate):
        try:
            value = Decimal(candidate)
        except InvalidOperation:  # pragma: no cover - the pattern only admits valid decimals
            return s
        if value == 0:
            return "0"
        out = format(value.normalize(), "f")
        return out.rstrip("0").rstrip(".") if "." in out else out
    return s


def exact_match(response_text: str, label: str | None) -> float:
    """1.0 if the whole response equals the label after :func:`normalize_answer`, else 0.0."""
    if label is None:
        raise ValueError("exact_match needs a label")
    return float(normalize_answer(response_text) == normalize_answer(label))


def last_boxed_content(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` (nested braces allowed), or None."""
    pos = len(text)
    while True:
        pos = text.rfind("\\boxed", 0, pos)
        if pos < 0:
            return None
        i = pos + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            end = closing_brace(text, i)
            if end is not None:
                return text[i + 1 : end]


def boxed_math(response_text: str, label: str | None) -> float:
    """1.0 if the last ``\\boxed{...}`` of the response is mathematically equal to the label (math-verify).

    The label may be bare (``"1/2"``), boxed or in ``$...$``. math-verify's timeouts use ``signal.alarm``, which
    only works in the main thread; elsewhere they are disabled.
    """
    if label is None:
        raise ValueError("boxed_math needs a label")
    content = last_boxed_content(response_text)
    if content is None or not content.strip():
        return 0.0
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = {} if in_main else {"parsing_timeout": None}
    gold_text = label if ("\\boxed" in label or "$" in label) else "\\boxed{" + label + "}"
    gold = parse(gold_text, **timeout)
    pred = parse("\\boxed{" + content + "}", **timeout)
    if not gold or not pred:
        return 0.0
    return float(verify(gold, pred, **({} if in_main else {"timeout_seconds": None})))


_REGISTRY: dict[str, str] = {
    "exact_match": f"{__name__}:exact_match",
    "boxed_math": f"{__name__}:boxed_math",
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


def prompt_text_for_reward(traj: Any) -> str:
    """The prompt handed to reward files: the source's rendered prompt (``metadata["prompt_text"]``) when known,
    else the raw prompt text, else the content of the last user message."""
    rendered = traj.metadata.get("prompt_text")
    if isinstance(rendered, str):
        return rendered
    if isinstance(traj.prompt, str):
        return traj.prompt
    users = [m for m in traj.prompt if m.get("role") == "user"] or traj.prompt
    return str(users[-1].get("content", ""))


# ------------------------------------------------------------------------------------------- runner
def _score_chunk(fn: RewardFunction, responses: list[str], prompts: list[str], labels: list) -> list[float]:
    return fn(responses, prompts, labels)


class RewardRunner:
    """Score batches with a reward function, in-process or in a spawn-context process pool.

    Args:
        fn: a :class:`RewardFunction`, a registered name or a reward file path.
        num_workers: 0 scores in the calling process; >= 1 uses that many worker processes.
        timeout_s: overall limit for one batch; on expiry :class:`RewardTimeoutError` is raised. Worker processes
            are killed (the pool restarts on the next call); in-process scoring runs in a daemon thread that is
            abandoned (Python cannot stop a thread), so the caller is released but the hung call keeps its thread.
            None waits forever.
        chunk_size: samples per task; default splits a batch evenly over the workers.
    """

    def __init__(
        self,
        fn: RewardFunction | str,
        num_workers: int = 0,
        timeout_s: float | None = None,
        chunk_size: int | None = None,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"RewardRunner.num_workers must be an int >= 0, got {num_workers!r}")
        if timeout_s is not None:
            if not timeout_s > 0:
                raise ValueError(f"RewardRunner.timeout_s must be > 0 or None, got {timeout_s!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"RewardRunner.chunk_size must be a positive int or None, got {chunk_size!r}")
        self.fn = get_reward_fn(fn)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self._pool: cf.ProcessPoolExecutor | None = None

    def __call__(self, responses: Sequence[str], prompts: Sequence[str], labels: Sequence[str | None]) -> list[float]:
        responses, prompts, labels = list(responses), list(prompts), list(labels)
        n = len(responses)
        if len(prompts) != n or len(labels) != n:
            raise ValueError(f"RewardRunner: {n} responses, {len(prompts)} prompts, {len(labels)} labels")
        if n == 0:
            return []
        if self.num_workers == 0:
            if self.timeout_s is None:
                return self.fn(responses, prompts, labels)
            return self._score_in_thread(responses, prompts, labels)
        size = self.chunk_size or -(-n // self.num_workers)
        pool = self._get_pool()
        futures = [
            pool.submit(_score_chunk, self.fn, responses[i : i + size], prompts[i : i + size], labels[i : i + size])
            for i in range(0, n, size)
        ]
        _, not_done = cf.wait(futures, timeout=self.timeout_s)
        if not_done:
            self._kill_pool()
            raise RewardTimeoutError(
                f"reward {self.fn.name!r} did not score {n} samples within {self.timeout_s} s "
                f"({len(not_done)} of {len(futures)} chunks unfinished)"
            )
        out: list[float] = []
        try:
            for fut in futures:
                out.extend(fut.result())
        except cf.process.BrokenProcessPool as err:
            self._kill_pool()
            raise RewardFunctionError(f"a worker process of reward {self.fn.name!r} died: {err}") from err
        return out

    def _score_in_thread(self, responses: list[str], prompts: list[str], labels: list) -> list[float]:
        """In-process scoring bounded by ``timeout_s``: the call runs in a daemon thread the caller waits on."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = self.fn(responses, prompts, labels)
            except BaseException as err:  # noqa: BLE001 - handed to the caller below
                box["err"] = err

        thread = threading.Thread(target=target, name=f"reward {self.fn.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise RewardTimeoutError(
                f"reward {self.fn.name!r} did not score {len(responses)} samples within {self.timeout_s} s "
                "(in-process scoring, --reward_num_workers 0: the hung call is abandoned; worker processes "
                "would be killed instead)")
        if "err" in box:
            raise box["err"]
        return box["out"]

    def score_trajectories(self, trajs: Sequence[Any]) -> list[float]:
        """Score trajectories from their own response text and store each reward in ``traj.reward``."""
        rewards = self(
            [t.response_text for t in trajs], [prompt_text_for_reward(t) for t in trajs], [t.label for t in trajs]
        )
        for traj, reward in zip(trajs, rewards):
            traj.reward = reward
        return rewards

    # --------------------------------------------------------------------------------------------- pool
    def _get_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=self.num_workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if hasattr(pool, "terminate_workers"):  # Python >= 3.14
            pool.terminate_workers()
            return
        # ProcessPoolExecutor before 3.14 cannot stop a running task; terminate its worker processes directly.
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for proc in processes:
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.join(timeout=5)

    def close(self) -> None:
        """Stop the worker processes. Between calls they are idle; a call still running (the caller was interrupted
        while waiting on it) is killed rather than waited for, so a hung reward cannot keep the run alive."""
        self._kill_pool()

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
