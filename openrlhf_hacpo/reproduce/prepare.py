"""Prompt files for the reproduction: the training set and one file per benchmark, plus a manifest.

Each output row is what :func:`openrlhf_hacpo.data.load_prompt_dataset` reads::

    {"input": [{"role": "user", "content": "<problem> Let's think step by step and output the final answer
                within \\boxed{}."}],
     "label": "<answer>", "prompt_id": "<set>:<row index>", "data_source": "<set>"}

Rows come from one of three places:

* the Hugging Face hub (``datasets.load_dataset(hub_id, config, split=split)``); before the first download the
  hub's host is probed with a short timeout, so a machine without network fails in seconds with a message that
  names ``--source_dir`` instead of retrying for minutes;
* a local folder laid out like the hub sets (``source_dir/<hub id>/...``, for example a
  ``huggingface-cli download --repo-type dataset <hub id> --local-dir source_dir/<hub id>`` copy): the ``.parquet``,
  ``.jsonl`` and ``.json`` files under it whose path has the config as a folder (when the set has a config) and
  whose file name starts with the split (``test.jsonl``, ``data/test-00000-of-00001.parquet``) or that sit in a
  folder named like the split;
* the ``champ-dataset`` wheel, for the ``champ`` set.

A set whose row count differs from the protocol's fails (:class:`RowCountError`) unless
``allow_row_count_mismatch``. Files are written atomically one set at a time, and the manifest is rewritten after
each set, keeping the entries of sets prepared earlier, so a failure never loses what was already prepared.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from openrlhf_hacpo.data.prompts import _read_local
from openrlhf_hacpo.reproduce.benchmarks import INSTRUCTION, DatasetSpec, LabelRule, Provenance, dataset_spec
from openrlhf_hacpo.rollout.math_reward import last_box, unwrap_box
from openrlhf_hacpo.utils.atomic import atomic_write_json, atomic_write_text

__all__ = [
    "CONTEXT_SEPARATOR",
    "HubUnavailableError",
    "MANIFEST_NAME",
    "PrepareConfig",
    "PrepareError",
    "RowCountError",
    "apply_overrides",
    "default_data_dir",
    "label_of",
    "prepare",
    "prompt_row",
    "read_rows",
]

MANIFEST_NAME = "manifest.json"
CONTEXT_SEPARATOR = "\n"
"""Between an OlympiadBench row's ``context`` and its question."""
_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_CHAMP_FILE = "champ_dataset/dataset_files/{split}.json"


class PrepareError(RuntimeError):
    """A set could not be read or turned into prompt rows; the message names the set (and the row)."""


class RowCountError(PrepareError):
    """A set has a different number of rows than the protocol expects."""


class HubUnavailableError(PrepareError):
    """The Hugging Face hub cannot be reached (offline machine or offline mode)."""


def default_data_dir() -> Path:
    """``$HACPO_CACHE_DIR/reproduce/data`` when the variable is set, else ``.cache/reproduce/data``."""
    root = os.environ.get("HACPO_CACHE_DIR")
    return (Path(root) if root else Path(".cache")) / "reproduce" / "data"


@dataclass(frozen=True)
class PrepareConfig:
    """What ``prepare`` writes and where it reads from.

    Attributes:
        output_dir: folder for ``<set>.jsonl`` and ``manifest.json``.
        sets: the sets to prepare (:class:`~openrlhf_hacpo.reproduce.benchmarks.DatasetSpec`).
        source_dir: local folder laid out like the hub sets; None reads the hub.
        allow_row_count_mismatch: write a set whose row count differs from the protocol's (recorded in the
            manifest) instead of failing.
        hub_timeout_s: how long the hub probe waits for a connection.
    """

    output_dir: Path
    sets: tuple[DatasetSpec, ...]
    source_dir: Path | None = None
    allow_row_count_mismatch: bool = False
    hub_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.sets:
            raise ValueError("PrepareConfig.sets is empty")
        names = [s.name for s in self.sets]
        if len(set(names)) != len(names):
            raise ValueError(f"PrepareConfig.sets repeats a set: {names}")
        if not self.hub_timeout_s > 0:
            raise ValueError(f"PrepareConfig.hub_timeout_s must be > 0, got {self.hub_timeout_s}")


def apply_overrides(spec: DatasetSpec, overrides: Iterable[str]) -> DatasetSpec:
    """Apply ``"<set>.<field>=<value>"`` settings that name this set (``aime25.hub_id=yentinglin/aime_2025``).

    ``config`` and ``context_field`` accept ``none``; ``expected_rows`` takes an integer.
    """
    changes: dict[str, Any] = {}
    for item in overrides:
        target, sep, value = item.partition("=")
        set_name, dot, field_name = target.partition(".")
        if not sep or not dot:
            raise ValueError(f"override {item!r} is not of the form <set>.<field>=<value>")
        dataset_spec(set_name)
        if set_name != spec.name:
            continue
        if field_name not in ("hub_id", "config", "split", "question_field", "answer_field", "label_rule",
                              "expected_rows", "context_field"):
            raise ValueError(f"override {item!r}: {field_name!r} is not a setting of a data set")
        if field_name == "expected_rows":
            try:
                changes[field_name] = int(value)
            except ValueError:
                raise ValueError(f"override {item!r}: expected_rows must be an integer") from None
        elif field_name == "label_rule":
            try:
                changes[field_name] = LabelRule(value)
            except ValueError:
                raise ValueError(
                    f"override {item!r}: label_rule must be one of {[r.value for r in LabelRule]}") from None
        elif field_name in ("config", "context_field") and value.lower() == "none":
            changes[field_name] = None
        else:
            changes[field_name] = value
    return replace(spec, **changes) if changes else spec


# ------------------------------------------------------------------------------------------------- labels
def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or value is None:
        raise PrepareError(f"{where}: answer must be a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    raise PrepareError(f"{where}: answer must be a string or a number, got {value!r}")


def label_of(spec: DatasetSpec, row: dict[str, Any], where: str) -> str:
    """The label of one source row by the set's :class:`LabelRule`."""
    if spec.answer_field not in row:
        raise PrepareError(f"{where} has no answer field {spec.answer_field!r} (fields: {sorted(row)})")
    value = row[spec.answer_field]
    if spec.label_rule is LabelRule.LAST_BOX:
        box = last_box(str(value))
        label = None if box is None else unwrap_box(box)
        if label is None:
            raise PrepareError(f"{where}: field {spec.answer_field!r} has no \\boxed{{...}} answer")
    elif spec.label_rule is LabelRule.AFTER_HASHES:
        text = str(value)
        if "####" not in text:
            raise PrepareError(f"{where}: field {spec.answer_field!r} has no '####' answer marker")
        label = text.split("####")[-1].strip().replace(",", "")
    elif spec.label_rule is LabelRule.FIRST_DOLLARS_STRIPPED:
        if isinstance(value, (list, tuple)):
            if not value:
                raise PrepareError(f"{where}: field {spec.answer_field!r} is an empty list")
            value = value[0]
        label = _scalar_text(value, where).strip("$").strip()
    else:
        label = _scalar_text(value, where)
    if not label:
        raise PrepareError(f"{where}: the label read from {spec.answer_field!r} is empty")
    return label


def prompt_row(spec: DatasetSpec, row: dict[str, Any], index: int) -> dict[str, Any]:
    """One output row: the chat prompt with the instruction, the label, ``<set>:<index>`` and the data source.

    The prompt text is ``question + " " + INSTRUCTION`` with the question exactly as the source stores it, leading
    and trailing whitespace and newlines included, as verl's preprocessing (``math_dataset.py``, ``gsm8k.py``) builds
    the official runs' prompts; an OlympiadBench ``context`` goes before it, also as stored.
    """
    where = f"set {spec.name!r} row {index}"
    if not isinstance(row, dict):
        raise PrepareError(f"{where} is a {type(row).__name__}, expected an object")
    question = row.get(spec.question_field)
    if not isinstance(question, str) or not question.strip():
        raise PrepareError(f"{where}: question field {spec.question_field!r} is missing or empty "
                           f"(fields: {sorted(row)})")
    context = row.get(spec.context_field) if spec.context_field else None
    if isinstance(context, str) and context.strip():
        question = context + CONTEXT_SEPARATOR + question
    return {
        # as verl's data preparation writes it: the question as stored (no stripping), a space, the instruction
        "input": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "label": label_of(spec, row, where),
        "prompt_id": f"{spec.name}:{index}",
        "data_source": spec.name,
    }


# ------------------------------------------------------------------------------------------------- sources
def _offline_mode() -> str | None:
    """The environment variable that puts the hub libraries in offline mode, when one is set."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return var
    return None


def _probe_hub(timeout_s: float) -> str | None:
    """None when the hub's host (``HF_ENDPOINT``) accepts a connection within ``timeout_s``, else why not.

    The name lookup is not bounded by a socket timeout, so the probe runs in a daemon thread that is given up on
    after ``timeout_s``.
    """
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append(None)
        except OSError as err:
            outcome.append(f"{type(err).__name__}: {err}")

    probe = threading.Thread(target=connect, name="hub-probe", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome:
        return f"{host}:{port} did not answer within {timeout_s:g} s"
    return None if outcome[0] is None else f"{host}:{port} cannot be reached ({outcome[0]})"


def _read_hub(spec: DatasetSpec, timeout_s: float) -> tuple[list[dict], dict[str, Any]]:
    """Rows from the hub; offline mode tries the ``datasets`` cache, otherwise the host is probed first."""
    hint = (f"prepare it offline from a local copy laid out like the hub sets with --source_dir DIR "
            f"(DIR/{spec.hub_id}/...)")
    offline_var = _offline_mode()
    if offline_var is None:
        unreachable = _probe_hub(timeout_s)
        if unreachable is not None:
            raise HubUnavailableError(
                f"set {spec.name!r}: the Hugging Face hub is unavailable: {unreachable}; {hint}")
    try:
        import datasets

        rows = [dict(r) for r in datasets.load_dataset(spec.hub_id, spec.config, split=spec.split)]
    except Exception as err:
        cls, why = (HubUnavailableError, f" ({offline_var} is set)") if offline_var else (PrepareError, "")
        raise cls(
            f"set {spec.name!r}: loading {spec.hub_id} (config {spec.config}, split {spec.split}) from the hub "
            f"failed{why}: {type(err).__name__}: {err}; {hint}"
        ) from err
    return rows, {"source": "hub", "hub_id": spec.hub_id, "config": spec.config, "split": spec.split}


def _local_files(spec: DatasetSpec, source_dir: Path) -> list[Path]:
    root = source_dir / spec.hub_id
    if not root.is_dir():
        raise PrepareError(
            f"set {spec.name!r}: no folder {root} (expected a copy of the hub dataset {spec.hub_id}, for example "
            f"huggingface-cli download --repo-type dataset {spec.hub_id} --local-dir {root})"
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in _DATA_SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if spec.config is not None:
        files = [p for p in files if spec.config in p.relative_to(root).parts[:-1]]

    def in_split(p: Path) -> bool:
        stem = p.name[: -len(p.suffix)]
        named = stem == spec.split or stem.startswith((spec.split + "-", spec.split + "_", spec.split + "."))
        return named or spec.split in p.relative_to(root).parts[:-1]

    chosen = [p for p in files if in_split(p)]
    if not chosen:
        raise PrepareError(
            f"set {spec.name!r}: no {'/'.join(_DATA_SUFFIXES)} file for config {spec.config} and split "
            f"{spec.split!r} under {root} (files there: {[str(p.relative_to(root)) for p in files] or 'none'})"
        )
    return chosen


def _read_local_copy(spec: DatasetSpec, source_dir: Path) -> tuple[list[dict], dict[str, Any]]:
    rows: list[dict] = []
    files = _local_files(spec, source_dir)
    for path in files:
        try:
            rows.extend(_read_local(path, spec.split))
        except ValueError as err:
            raise PrepareError(f"set {spec.name!r}: {err}") from err
    return rows, {"source": "local", "hub_id": spec.hub_id, "config": spec.config, "split": spec.split,
                  "files": [str(p) for p in files]}


def _read_champ(spec: DatasetSpec) -> tuple[list[dict], dict[str, Any]]:
    try:
        dist = importlib.metadata.distribution(spec.hub_id)
    except importlib.metadata.PackageNotFoundError:
        raise PrepareError(f"set {spec.name!r}: the {spec.hub_id} wheel is not installed "
                           f"(pip install --no-deps {spec.hub_id})") from None
    path = Path(str(dist.locate_file(_CHAMP_FILE.format(split=spec.split))))
    if not path.is_file():
        raise PrepareError(f"set {spec.name!r}: {path} is not in the installed {spec.hub_id} {dist.version}")
    try:
        problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise PrepareError(f"set {spec.name!r}: {path} has no 'problems' object ({err})") from err
    rows = list(problems.values()) if isinstance(problems, dict) else list(problems)
    return rows, {"source": "wheel", "hub_id": spec.hub_id, "version": dist.version, "split": spec.split,
                  "files": [str(path)]}


def read_rows(spec: DatasetSpec, source_dir: Path | None = None,
              hub_timeout_s: float = 5.0) -> tuple[list[dict], dict[str, Any]]:
    """The source rows of a set and a description of where they came from."""
    if spec.provenance is Provenance.OFFLINE:
        return _read_champ(spec)
    if source_dir is not None:
        return _read_local_copy(spec, Path(source_dir))
    return _read_hub(spec, hub_timeout_s)


# ------------------------------------------------------------------------------------------------- writing
def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise PrepareError(f"{path}: the existing manifest is not valid JSON ({err}); move it away") from err
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sets", {}), dict):
        raise PrepareError(f"{path}: the existing manifest has no 'sets' object; move it away")
    return manifest


def prepare(config: PrepareConfig, log=print) -> dict[str, Any]:
    """Write ``<set>.jsonl`` for every set of ``config`` and update ``manifest.json``; returns the manifest."""
    out = Path(config.output_dir)
    manifest_path = out / MANIFEST_NAME
    manifest = _read_manifest(manifest_path)
    manifest.setdefault("sets", {})
    manifest["instruction"] = INSTRUCTION
    for spec in config.sets:
        start = time.monotonic()
        rows, source = read_rows(spec, config.source_dir, config.hub_timeout_s)
        if len(rows) != spec.expected_rows and not config.allow_row_count_mismatch:
            raise RowCountError(
                f"set {spec.name!r}: {len(rows)} rows from {spec.hub_id} (config {spec.config}, split {spec.split}), "
                f"the protocol expects {spec.expected_rows}; pass --allow_row_count_mismatch to write it anyway"
            )
        records = [prompt_row(spec, row, i) for i, row in enumerate(rows)]
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        path = atomic_write_text(out / f"{spec.name}.jsonl", text)
        manifest["sets"][spec.name] = {
            "file": path.name,
            "rows": len(records),
            "expected_rows": spec.expected_rows,
            "row_count_matches": len(records) == spec.expected_rows,
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "data_source": spec.name,
            "provenance": spec.provenance.value,
            "question_field": spec.question_field,
            "answer_field": spec.answer_field,
            "label_rule": spec.label_rule.value,
            "context_field": spec.context_field,
            "paper_column": spec.paper_column,
            "metric": spec.metric,
            **source,
        }
        atomic_write_json(manifest_path, manifest)
        note = "" if len(records) == spec.expected_rows else f" (protocol: {spec.expected_rows})"
        log(f"{spec.name}: {len(records)} rows{note} -> {path} [{time.monotonic() - start:.1f} s]")
    return manifest
