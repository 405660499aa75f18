"""Build tiny agents once and keep them as Hugging Face folders.

The main job trains the agents that ship with the package (:mod:`openrlhf_hacpo.zoo.shipped`); this module builds
agents from their recipes on this machine, for ``--rebuild`` and for custom agent specs.

An agent lives in ``<cache_dir>/<name>-<spec hash>/`` with ``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer files and ``zoo_meta.json`` (spec, hash, warm-start record, test
accuracy, library versions). The hash covers the agent spec, the task splits and :data:`ZOO_FORMAT_VERSION`, so a
changed spec maps to a new folder and is built afresh; an unchanged spec reuses the folder.

``cache_dir`` defaults to ``$HACPO_CACHE_DIR/zoo`` when that variable is set, else ``<repo>/.cache/zoo`` for a
source checkout, else ``~/.cache/openrlhf_hacpo/zoo``. Builds happen in a temporary sibling folder that is renamed
into place when complete (:func:`openrlhf_hacpo.utils.atomic.atomic_dir`), so a killed build never leaves a
half-written agent behind; temporary folders of killed builds are removed by a later build once a day old.
Processes that ask for the same missing agent at once build it once: the others wait on a lock file beside the
folder (``.<name>-<hash>.lock``) and take the first one's build.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import tokenizers
import torch
import transformers
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from openrlhf_hacpo.data.arithmetic import TaskConfig, make_splits
from openrlhf_hacpo.utils.atomic import atomic_dir, atomic_write_json
from openrlhf_hacpo.zoo.evaluate import evaluate_accuracy
from openrlhf_hacpo.zoo.models import build_model, num_parameters
from openrlhf_hacpo.zoo.presets import AgentSpec, Preset, resolve_agents
from openrlhf_hacpo.zoo.tokenizers import build_tokenizer
from openrlhf_hacpo.zoo.warmstart import warm_start

__all__ = [
    "ZOO_FORMAT_VERSION",
    "META_FILE",
    "default_cache_dir",
    "spec_hash",
    "agent_dir",
    "is_built",
    "read_meta",
    "build_agent",
    "build_zoo",
    "load_agent",
]

ZOO_FORMAT_VERSION = 1
META_FILE = "zoo_meta.json"
_STALE_SECONDS = 24 * 3600


def default_cache_dir() -> Path:
    """``$HACPO_CACHE_DIR/zoo``, else ``<repo>/.cache/zoo`` in a source checkout, else the user cache."""
    env = os.environ.get("HACPO_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "zoo"
    repo = Path(__file__).resolve().parents[2]
    if (repo / "setup.py").is_file() and (repo / "openrlhf_hacpo").is_dir():
        return repo / ".cache" / "zoo"
    return Path.home() / ".cache" / "openrlhf_hacpo" / "zoo"


def spec_hash(spec: AgentSpec, task: TaskConfig = TaskConfig()) -> str:
    """12 hex digits of sha256 over the spec, the task splits' config and the cache format version."""
    payload = {"format": ZOO_FORMAT_VERSION, "spec": dataclasses.asdict(spec), "task": dataclasses.asdict(task)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def agent_dir(spec: AgentSpec, cache_dir: str | os.PathLike | None = None, task: TaskConfig = TaskConfig()) -> Path:
    return Path(cache_dir or default_cache_dir()) / f"{spec.name}-{spec_hash(spec, task)}"


def read_meta(path: str | os.PathLike) -> dict:
    """The ``zoo_meta.json`` of a built agent folder."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a built zoo agent (no {META_FILE})")
    return json.loads(meta_path.read_text(encoding="utf-8"))


def is_built(path: str | os.PathLike, spec: AgentSpec, task: TaskConfig = TaskConfig()) -> bool:
    """True when ``path`` holds a complete build of exactly this spec."""
    try:
        return read_meta(path).get("spec_hash") == spec_hash(spec, task)
    except (FileNotFoundError, json.JSONDecodeError):
        return False


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _remove_stale_builds(cache_dir: Path, name: str) -> None:
    """Delete temporary folders of ``name`` left by builds that were killed (untouched for a day)."""
    cutoff = time.time() - _STALE_SECONDS
    for tmp in cache_dir.glob(f".{name}.*"):
        if tmp.is_dir() and tmp.stat().st_mtime < cutoff:
            shutil.rmtree(tmp, ignore_errors=True)


def _build_into(out: Path, spec: AgentSpec, task: TaskConfig, log: Callable[[str], None] | None) -> dict:
    splits = make_splits(task)
    tokenizer = build_tokenizer(spec.tokenizer)
    model = build_model(spec.model, tokenizer, seed=spec.warm_start.seed)
    if log:
        log(f"{type(model).__name__}, {num_parameters(model):,} parameters, vocab {len(tokenizer)}")
    result = warm_start(
        model,
        tokenizer,
        spec.warm_start,
        probe_problems=splits.validation,
        exclude=splits.validation + splits.test,
        log=log,
    )
    t0 = time.perf_counter()
    test = evaluate_accuracy(model, tokenizer, splits.test)
    eval_s = time.perf_counter() - t0
    if log:
        log(
            f"warm start: {result.steps} steps ({result.stop_reason}), {result.train_seconds:.1f}s training "
            f"({result.train_cpu_seconds:.1f} CPU s); "
            f"test greedy accuracy {test.accuracy:.3f} on {test.num_problems} problems ({eval_s:.1f}s)"
        )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {
        "format_version": ZOO_FORMAT_VERSION,
        "name": spec.name,
        "spec_hash": spec_hash(spec, task),
        "spec": dataclasses.asdict(spec),
        "task": dataclasses.asdict(task),
        "architecture": type(model).__name__,
        "num_parameters": num_parameters(model),
        "vocab_size": len(tokenizer),
        "warm_start": dataclasses.asdict(result),
        "test": {**test.summary(), "seconds": eval_s},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "python": platform.python_version(),
        },
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_json(out / META_FILE, meta)
    return meta


def build_agent(
    spec: AgentSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    progress: bool = True,
    threads: int = 1,
    force: bool = False,
    task: TaskConfig = TaskConfig(),
) -> Path:
    """The folder of ``spec``'s agent, building it first when missing, incomplete or ``force``d. Processes that ask
    for a missing agent at once build it once: the others wait on a lock file beside the folder, then take it."""
    final = agent_dir(spec, cache_dir, task)
    if not force and is_built(final, spec, task):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    log = (lambda msg: print(f"[zoo] {spec.name}: {msg}", file=sys.stderr, flush=True)) if progress else None
    with FileLock(str(final.parent / f".{final.name}.lock")):
        if not force and is_built(final, spec, task):  # built by the process that held the lock
            return final
        _remove_stale_builds(final.parent, final.name)
        with _torch_threads(threads), atomic_dir(final) as tmp:
            _build_into(tmp, spec, task, log)
    if log:
        log(f"saved to {final}")
    return final


def build_zoo(
    preset_or_names: str | Preset | Sequence[str | AgentSpec],
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    jobs: int = 1,
    force: bool = False,
) -> dict[str, Path]:
    """Build (or reuse) every agent of a preset or list of agents; returns ``{agent name: folder}``.

    ``jobs > 1`` builds missing agents in that many processes (one torch thread each)."""
    specs = resolve_agents(preset_or_names)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    cache_dir = Path(cache_dir or default_cache_dir())
    paths = {s.name: agent_dir(s, cache_dir) for s in specs}
    todo = [s for s in specs if force or not is_built(paths[s.name], s)]
    if progress:
        for s in specs:
            state = "building" if s in todo else "cached"
            print(f"[zoo] {s.name}: {state} at {paths[s.name]}", file=sys.stderr, flush=True)
    if jobs == 1 or len(todo) < 2:
        for s in todo:
            build_agent(s, cache_dir, progress=progress, force=force)
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(build_agent, s, cache_dir, progress=progress, force=force) for s in todo]
            for f in futures:
                f.result()
    return paths


def load_agent(
    path: str | os.PathLike, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (sdpa attention, eval mode) and tokenizer of a built agent folder."""
    read_meta(path)  # fails clearly on a folder that is not a complete build
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=dtype)
    model.eval()
    return model, tokenizer
