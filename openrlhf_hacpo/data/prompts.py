"""Prompt datasets: records from local jsonl / json / parquet files or Hugging Face hub datasets, and a resumable
loader.

Every record becomes a :class:`PromptRecord` with a stable ``prompt_id`` (the record's ``prompt_id`` field when
present, else ``"<file stem>:<row index>"``), the prompt (a string or a list of chat messages, from ``input_key``)
and the label (from ``label_key``, as a string: a number as its shortest text, a list or object as JSON). Every agent
receives the same records, so the prompt id is the key that groups all agents' responses to one prompt.

Local files are UTF-8 (a byte-order mark is ignored). A file that cannot be read is a ``ValueError`` naming the file
and, for text files, the line: bytes that are not UTF-8, invalid JSON, JSON nested too deeply for the parser; a record
that does not fit names the file and the record (its 0-based index) and the field.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from openrlhf_hacpo.rollout.trajectory import Prompt, validate_prompt
from openrlhf_hacpo.utils.jsonl import UTF8_BOM, encoding_hint, read_jsonl

__all__ = ["PromptDataLoader", "PromptRecord", "load_prompt_dataset"]

_EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: id, prompt (text or chat messages), label (None without a label key), other fields."""

    prompt_id: str
    prompt: Prompt
    label: str | None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)


def _decode(data: bytes, path: Path, first_line: int = 1) -> str:
    """UTF-8 text of ``data`` (without a leading byte-order mark); an undecodable byte is a ``ValueError`` naming the
    file, line and column."""
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"{path}:{line}: byte 0x{data[err.start]:02x} at column {column} is not valid UTF-8 "
                         f"(prompt files must be UTF-8 encoded{encoding_hint(data)})") from None


def _too_deep_line(text: str, limit: int) -> int:
    """The line where ``text``'s JSON arrays / objects first nest more than ``limit`` deep (strings skipped); 1 when
    they never do."""
    depth, line, in_string, escaped = 0, 1, False, False
    for char in text:
        if char == "\n":
            line += 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line
        elif char in "]}":
            depth -= 1
    return 1


def _read_json(path: Path, split: str) -> list[Any]:
    text = _decode(path.read_bytes(), path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: invalid JSON ({err})") from err
    except ValueError as err:  # an integer too long to convert
        raise ValueError(f"{path}: invalid JSON ({err})") from err
    except RecursionError:
        line = _too_deep_line(text, limit=sys.getrecursionlimit() // 2)
        raise ValueError(f"{path}:{line}: JSON nested too deeply to parse (arrays and objects inside one another, "
                         "hundreds of levels deep)") from None
    if isinstance(data, dict):
        if isinstance(data.get(split), list):
            return data[split]
        if isinstance(data.get("data"), list):
            return data["data"]
        raise ValueError(f"{path}: a JSON object must hold the records as a list under {split!r} or 'data'")
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow's ArrowInvalid / ArrowException / OSError for a damaged file
        raise ValueError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from err


def _read_local(path: Path, split: str) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(path)
    if suffix == ".json":
        return _read_json(path, split)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise ValueError(f"{path}: unsupported prompt file extension {suffix!r} (supported: {', '.join(_EXTENSIONS)})")


def _read_hub(name: str, split: str) -> list[Any]:
    try:
        import datasets

        return list(datasets.load_dataset(name, split=split))
    except Exception as err:
        raise FileNotFoundError(
            f"prompt dataset {name!r} does not exist locally and could not be loaded from the Hugging Face hub "
            f"({type(err).__name__}: {err})"
        ) from err


def _label_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: label must be a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: label must be a finite number, got {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as err:
        raise ValueError(f"{where}: label {type(value).__name__} cannot be written as JSON text "
                         f"({type(err).__name__}: {err})") from None


def _prompt_id(row: dict, where: str) -> str | None:
    """The record's own ``prompt_id`` as text (a non-empty string or an int), None when it has none."""
    value = row.get("prompt_id")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value:
        return value
    raise ValueError(f"{where} field 'prompt_id' must be a non-empty string or an int, got {type(value).__name__}")


def load_prompt_dataset(
    path_or_name: str | os.PathLike,
    input_key: str = "input",
    label_key: str | None = "label",
    split: str = "train",
    max_samples: int | None = None,
) -> list[PromptRecord]:
    """Load prompt records.

    Args:
        path_or_name: a local ``.jsonl`` / ``.json`` / ``.parquet`` file, or a hub dataset name.
        input_key: field holding the prompt (a string or a list of ``{"role", "content"}`` messages).
        label_key: field holding the ground-truth answer; None for unlabelled prompts.
        split: the split of a hub dataset (or of a JSON object keyed by split).
        max_samples: keep only the first ``max_samples`` records.
    """
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
        raise ValueError(f"max_samples must be a positive int or None, got {max_samples!r}")
    path = Path(path_or_name).expanduser()
    try:
        exists = path.exists()
    except (OSError, ValueError) as err:  # a NUL byte in the name, a name too long for the file system
        raise ValueError(f"prompt file {str(path_or_name)[:200]!r}: not a usable path ({err})") from None
    if exists:
        if path.is_dir():
            raise ValueError(f"{path} is a directory; pass a {'/'.join(_EXTENSIONS)} file")
        rows, source, stem = _read_local(path, split), str(path), path.stem
    elif path.suffix.lower() in _EXTENSIONS or (os.sep in str(path_or_name) and not _looks_like_hub_name(path_or_name)):
        raise FileNotFoundError(f"prompt file {path} does not exist")
    else:
        name = str(path_or_name)
        rows, source, stem = _read_hub(name, split), name, name.replace("/", "_")
    if not rows:
        raise ValueError(f"prompt dataset {source} is empty")
    if max_samples is not None:
        rows = rows[:max_samples]

    records, seen = [], {}
    for index, row in enumerate(rows):
        where = f"{source}: record {index}"
        if not isinstance(row, dict):
            raise ValueError(f"{where} is a {type(row).__name__}, expected an object")
        if input_key not in row:
            raise ValueError(f"{where} has no input key {input_key!r} (keys: {sorted(row)})")
        prompt = validate_prompt(row[input_key], f"{where} field {input_key!r}")
        for i, message in enumerate(prompt if isinstance(prompt, list) else ()):
            if not isinstance(message["content"], str):  # a chat template would drop or garble it
                raise ValueError(f"{where} field {input_key!r}[{i}] content must be a string, got "
                                 f"{type(message['content']).__name__}")
        label = None
        if label_key is not None:
            if label_key not in row:
                raise ValueError(f"{where} has no label key {label_key!r} (keys: {sorted(row)})")
            label = _label_text(row[label_key], f"{where} field {label_key!r}")
        prompt_id = _prompt_id(row, where) or f"{stem}:{index}"
        if prompt_id in seen:
            raise ValueError(f"{where} repeats prompt_id {prompt_id!r} of record {seen[prompt_id]}")
        seen[prompt_id] = index
        extra = {k: v for k, v in row.items() if k not in (input_key, label_key, "prompt_id")}
        records.append(PromptRecord(prompt_id=prompt_id, prompt=prompt, label=label, metadata=extra))
    return records


def _looks_like_hub_name(name: Any) -> bool:
    """``owner/dataset``: one slash, no leading dot or slash."""
    text = str(name)
    return text.count("/") == 1 and not text.startswith((".", "/", "~"))


class PromptDataLoader:
    """Batches of prompt records with a seeded shuffle per epoch and a resumable cursor.

    The order of epoch e is a permutation drawn from ``random.Random(f"{seed}:{e}")``, so it depends only on the
    seed and the epoch. :meth:`state_dict` records (epoch, position, seed); loading it continues with exactly the
    batches an uninterrupted run would have produced.

    Args:
        records: the dataset.
        batch_size: prompts per batch (per training step).
        seed: shuffle seed.
        shuffle: False keeps file order in every epoch.
        drop_last: skip an epoch's final batch when it is smaller than ``batch_size``.
    """

    def __init__(
        self,
        records: list[PromptRecord],
        batch_size: int,
        seed: int = 42,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if not records:
            raise ValueError("PromptDataLoader: records is empty")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"PromptDataLoader.batch_size must be a positive int, got {batch_size!r}")
        if drop_last and batch_size > len(records):
            raise ValueError(
                f"PromptDataLoader.batch_size={batch_size} exceeds the {len(records)} records (drop_last=True)"
            )
        self.records = list(records)
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._order: list[int] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.records)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def _current_order(self) -> list[int]:
        if self._order is None:
            self._order = self.epoch_order(self.epoch)
        return self._order

    def _epoch_done(self) -> bool:
        remaining = len(self.records) - self.position
        return remaining <= 0 or (self.drop_last and remaining < self.batch_size)

    def next_batch(self) -> list[PromptRecord]:
        """The next batch, moving on to the next epoch (a fresh permutation) when this one is used up."""
        if self._epoch_done():
            self.epoch += 1
            self.position = 0
            self._order = None
        order = self._current_order()
        idx = order[self.position : self.position + self.batch_size]
        self.position += len(idx)
        return [self.records[i] for i in idx]

    def __iter__(self) -> Iterator[list[PromptRecord]]:
        """The remaining batches of the current epoch (the cursor advances with them)."""
        if self._epoch_done():
            self.epoch += 1
            self.position = 0
            self._order = None
        while not self._epoch_done():
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_records": len(self.records),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("num_records", "batch_size", "shuffle", "drop_last"):
            mine = len(self.records) if key == "num_records" else getattr(self, key)
            if key in state and state[key] != mine:
                raise ValueError(f"PromptDataLoader state has {key}={state[key]!r} but this loader has {mine!r}")
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise ValueError(f"PromptDataLoader state misses {sorted(missing)}")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = None
