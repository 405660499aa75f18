"""JSON-lines files (one JSON value per line): the package's one reader.

Blank lines are skipped; a UTF-8 byte-order mark at the start of the file is ignored. A line that is not UTF-8 or not
JSON (nested too deeply for the parser included) is a ``ValueError`` naming the file and the line
(``<path>:<line>: ...``), so a bad record is found without opening the file in an editor. Appended logs (the
trainer's ``metrics.jsonl``) may end in a torn line when the writer was killed mid-append; ``skip_torn_tail``
drops that one line: the last line of the file, without its newline, that does not parse.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

__all__ = ["UTF8_BOM", "encoding_hint", "iter_jsonl", "read_jsonl", "read_records"]


UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
               b"\xfe\xff": "UTF-16"}


def encoding_hint(head: bytes) -> str:
    """``"; the file starts with a UTF-16 byte-order mark, save it as UTF-8"`` when ``head`` (a file's first bytes)
    starts with a UTF-16 or UTF-32 byte-order mark, else ``""``: for errors about bytes that are not UTF-8."""
    name = next((name for mark, name in _OTHER_BOMS.items() if head.startswith(mark)), None)
    return f"; the file starts with a {name} byte-order mark, save it as UTF-8" if name else ""


def _decode_line(raw: bytes, path: Path, lineno: int) -> str:
    if lineno == 1 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        hint = encoding_hint(raw) if lineno == 1 else ""
        raise ValueError(f"{path}:{lineno}: byte 0x{raw[err.start]:02x} at column {err.start + 1} is not valid "
                         f"UTF-8 (jsonl files must be UTF-8 encoded{hint})") from None


def iter_jsonl(path: str | os.PathLike, *, skip_torn_tail: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``path`` (line numbers start at 1).

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` ``"<path>:<line>: ..."`` for a line that
    is not UTF-8 or not JSON (except a torn last line under ``skip_torn_tail``)."""
    p = Path(path)
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            torn_tail = skip_torn_tail and not raw.endswith(b"\n")  # only the last line can lack its newline
            try:
                line = _decode_line(raw, p, lineno)
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as err:  # JSONDecodeError, or an integer too long to convert
                    raise ValueError(f"{p}:{lineno}: invalid JSON line ({err})") from err
                except RecursionError:
                    raise ValueError(f"{p}:{lineno}: JSON line nested too deeply to parse (arrays and objects "
                                     "inside one another, hundreds of levels deep)") from None
            except ValueError:
                if torn_tail:
                    return
                raise
            yield lineno, value


def read_jsonl(path: str | os.PathLike, *, missing_ok: bool = False, skip_torn_tail: bool = False) -> list[Any]:
    """Every value of a jsonl file, in order (see :func:`iter_jsonl`); ``missing_ok`` reads a missing file as
    empty."""
    if missing_ok and not Path(path).exists():
        return []
    return [value for _, value in iter_jsonl(path, skip_torn_tail=skip_torn_tail)]


def read_records(path: str | os.PathLike) -> list[Any]:
    """Records of a run's appended log (``metrics.jsonl`` / ``eval.jsonl``): a missing file has none, and a torn
    last line from an interrupted append is skipped (any other bad line is a ``ValueError`` naming the file and
    line)."""
    return read_jsonl(path, missing_ok=True, skip_torn_tail=True)
