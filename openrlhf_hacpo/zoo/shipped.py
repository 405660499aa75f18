"""The agents that ship with the package, their manifests, and which folder a preset's agents come from.

The zoo's warm start stops at the first probe inside an accuracy band, and which probe that is depends on the
floating-point environment, so two machines can build different agents from the same recipe. The agents behind the
README's tables therefore ship with the package, one folder per agent under :data:`SHIPPED_DIR`::

    openrlhf_hacpo/zoo/agents/<name>/config.json, model.safetensors, generation_config.json, tokenizer files,
                                     zoo_meta.json (the build's record), MANIFEST.json

``MANIFEST.json`` holds the sha256 of every other file of the folder, the build recipe (the agent spec, its hash,
the task splits), the versions that built it, the build command and the agent's **fingerprint**: the first 12 hex
digits of the sha256 of ``model.safetensors``. Two agents with the same fingerprint have the same weights; the
fingerprint names an agent wherever results are written (``summary.json``, the comparison reports), so results of a
rebuilt agent that differs from the shipped one are never mistaken for results of the shipped one.

:func:`agent_folders` is what the main job, the comparison and the tiny CLI call: the shipped folders (checked
against their manifests) by default, or, with ``rebuild=True``, agents built on this machine into the zoo cache
(:func:`openrlhf_hacpo.zoo.build_zoo`). An agent spec without a shipped folder (a custom spec, or an edited one
whose hash no longer matches the manifest) is always built.

:func:`ship_agents` copies built agents into :data:`SHIPPED_DIR` and writes their manifests
(``python -m openrlhf_hacpo.zoo ship``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from openrlhf_hacpo.utils.atomic import atomic_dir, atomic_write_json
from openrlhf_hacpo.zoo.cache import META_FILE, build_zoo, read_meta, spec_hash
from openrlhf_hacpo.zoo.presets import AgentSpec, Preset, resolve_agents

__all__ = [
    "MANIFEST_FILE",
    "MANIFEST_VERSION",
    "SHIPPED_DIR",
    "WEIGHTS_FILE",
    "ShippedAgentError",
    "agent_folders",
    "agent_record",
    "agent_records",
    "file_sha256",
    "read_manifest",
    "ship_agents",
    "shipped_folder",
    "verify_folder",
    "weights_fingerprint",
]

SHIPPED_DIR = Path(__file__).resolve().parent / "agents"
MANIFEST_FILE = "MANIFEST.json"
MANIFEST_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
FINGERPRINT_DIGITS = 12


class ShippedAgentError(ValueError):
    """A shipped agent folder that does not match its manifest (a missing, extra or changed file)."""


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_fingerprint(folder: str | os.PathLike) -> str:
    """The agent's name for results: the first 12 hex digits of the sha256 of its ``model.safetensors``."""
    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {WEIGHTS_FILE}, so not an agent folder")
    return file_sha256(path)[:FINGERPRINT_DIGITS]


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``MANIFEST.json`` of a shipped agent folder."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {MANIFEST_FILE}, so not a shipped agent")
    return json.loads(path.read_text(encoding="utf-8"))


def verify_folder(folder: str | os.PathLike) -> dict[str, Any]:
    """Check every file of a shipped agent folder against its manifest; returns the manifest.

    Raises :class:`ShippedAgentError` naming the agent and the file at fault when a listed file is missing or its
    sha256 differs, or when the folder holds a file the manifest does not list."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    name = manifest.get("name", folder.name)
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise ShippedAgentError(f"shipped agent {name!r}: {folder / MANIFEST_FILE} lists no files")
    for file, entry in sorted(listed.items()):
        path = folder / file
        if not path.is_file():
            raise ShippedAgentError(f"shipped agent {name!r}: {path} is missing (listed in {MANIFEST_FILE})")
        actual = file_sha256(path)
        if actual != entry["sha256"]:
            raise ShippedAgentError(f"shipped agent {name!r}: {path} has sha256 {actual}, the manifest says "
                                    f"{entry['sha256']}")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in listed and p.name != MANIFEST_FILE)
    if extra:
        raise ShippedAgentError(f"shipped agent {name!r}: {folder} holds files the manifest does not list: {extra}")
    if manifest.get("fingerprint") != listed[WEIGHTS_FILE]["sha256"][:FINGERPRINT_DIGITS]:
        raise ShippedAgentError(f"shipped agent {name!r}: the manifest's fingerprint {manifest.get('fingerprint')!r} "
                                f"is not the sha256 of its {WEIGHTS_FILE}")
    return manifest


def shipped_folder(spec: AgentSpec, root: str | os.PathLike | None = None) -> Path | None:
    """The shipped folder of ``spec`` (``<root>/<name>`` whose manifest has this spec's hash), else ``None``."""
    folder = Path(root or SHIPPED_DIR) / spec.name
    try:
        manifest = read_manifest(folder)
    except FileNotFoundError:
        return None
    return folder if manifest.get("spec_hash") == spec_hash(spec) else None


def agent_folders(
    preset_or_names: str | Preset | Sequence[str | AgentSpec],
    cache_dir: str | os.PathLike | None = None,
    *,
    rebuild: bool = False,
    progress: bool = True,
    jobs: int = 1,
    shipped_root: str | os.PathLike | None = None,
) -> dict[str, Path]:
    """``{agent name: folder}`` for a preset or list of agents.

    By default the shipped folder of every agent that has one (its files checked against the manifest) and, for
    the others, an agent built into the zoo cache on first use. ``rebuild=True`` uses agents built on this machine
    for all of them (built once into ``cache_dir``; ``python -m openrlhf_hacpo.zoo build --force`` builds anew)."""
    specs = resolve_agents(preset_or_names)
    out: dict[str, Path] = {}
    to_build: list[AgentSpec] = []
    root = Path(shipped_root or SHIPPED_DIR)
    for spec in specs:
        folder = None if rebuild else shipped_folder(spec, root)
        if folder is None:
            if not rebuild and progress and (root / spec.name / MANIFEST_FILE).is_file():
                print(f"[zoo] {spec.name}: the shipped agent was built from another spec; building this one",
                      file=sys.stderr, flush=True)
            to_build.append(spec)
            continue
        verify_folder(folder)
        out[spec.name] = folder
        if progress:
            print(f"[zoo] {spec.name}: shipped agent {read_manifest(folder)['fingerprint']} at {folder}",
                  file=sys.stderr, flush=True)
    built = build_zoo(to_build, cache_dir, progress=progress, jobs=jobs) if to_build else {}
    return {spec.name: out.get(spec.name) or built[spec.name] for spec in specs}


def agent_record(folder: str | os.PathLike, shipped_root: str | os.PathLike | None = None) -> dict[str, Any]:
    """How results name the agent in ``folder``.

    ``fingerprint`` (its weights' hash), ``spec_hash``, ``path``, ``shipped_fingerprint`` (of the shipped agent of
    that name, ``None`` when none ships) and ``source``: ``"shipped"`` when the weights are the shipped agent's,
    else ``"built"`` (a rebuild or a custom agent; its own fingerprint tells it apart)."""
    folder = Path(folder)
    meta = read_meta(folder)
    fingerprint = weights_fingerprint(folder)
    shipped = Path(shipped_root or SHIPPED_DIR) / meta["name"]
    try:
        shipped_fp = read_manifest(shipped)["fingerprint"]
    except FileNotFoundError:
        shipped_fp = None
    return {"fingerprint": fingerprint, "source": "shipped" if fingerprint == shipped_fp else "built",
            "shipped_fingerprint": shipped_fp, "spec_hash": meta["spec_hash"], "path": str(folder)}


def agent_records(folders: Mapping[str, Path], shipped_root: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`agent_record` of every agent folder, by agent name."""
    return {name: agent_record(path, shipped_root) for name, path in folders.items()}


def _manifest(folder: Path, command: str) -> dict[str, Any]:
    meta = read_meta(folder)
    files = {p.name: {"sha256": file_sha256(p), "bytes": p.stat().st_size}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST_FILE}
    ws = meta["warm_start"]
    return {
        "manifest_version": MANIFEST_VERSION,
        "name": meta["name"],
        "fingerprint": files[WEIGHTS_FILE]["sha256"][:FINGERPRINT_DIGITS],
        "spec_hash": meta["spec_hash"],
        "recipe": {"spec": meta["spec"], "task": meta["task"], "zoo_format_version": meta["format_version"],
                   "build_command": command},
        "built_with": {"python": platform.python_version(), **meta["versions"]},
        "built_at": meta["built_at"],
        "architecture": meta["architecture"],
        "num_parameters": meta["num_parameters"],
        "vocab_size": meta["vocab_size"],
        "warm_start": {"steps": ws["steps"], "stop_reason": ws["stop_reason"], "probe_accuracy": ws["probe_accuracy"],
                       "band": meta["spec"]["warm_start"]["target_band"]},
        "test_accuracy": meta["test"]["accuracy"],
        "files": files,
    }


def ship_agents(folders: Mapping[str, Path], root: str | os.PathLike | None = None,
                command: str = "python -m openrlhf_hacpo.zoo build --agents <name>") -> dict[str, Path]:
    """Copy built agent folders into ``root`` (default :data:`SHIPPED_DIR`) as ``<root>/<name>/`` with a
    ``MANIFEST.json``; an existing shipped folder of that name is replaced (atomically). Returns the new folders."""
    root = Path(root or SHIPPED_DIR)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, src in folders.items():
        src = Path(src)
        meta = read_meta(src)
        if meta["name"] != name:
            raise ValueError(f"ship_agents: {src} holds agent {meta['name']!r}, not {name!r}")
        with atomic_dir(root / name) as tmp:
            for p in sorted(src.iterdir()):
                if p.is_file() and p.name != MANIFEST_FILE:
                    shutil.copy2(p, tmp / p.name)
            atomic_write_json(tmp / MANIFEST_FILE, _manifest(tmp, command.replace("<name>", name)), sort_keys=False)
        verify_folder(root / name)
        out[name] = root / name
    return out
