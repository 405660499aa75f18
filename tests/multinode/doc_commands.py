"""The shell commands of docs/multinode.md, as the multi-node tests run them.

Every ```bash block of the page sits under a marker comment saying how it is tested:

* ``<!-- test: run -->``: each command is run against the test's two-raylet cluster;
* ``<!-- test: gpu-only: REASON -->``: the command needs real GPUs (REASON says why); the test parses it and checks
  its node plan on fake GPUs;
* ``<!-- test: flags -->``: command-line fragments (``--agent ...`` lines), each parsed.

A command is a logical line (``\\`` continuations joined) split as the shell would (``shlex``, comments dropped);
``export NAME=VALUE`` lines set the environment of the commands after them in the block. :func:`substitute` puts the
test's addresses, ports and paths in place of the page's placeholders.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "multinode.md"
MARKER = re.compile(r"^<!--\s*test:\s*(?P<tag>[a-z-]+)\s*(?::\s*(?P<reason>.*?))?\s*-->$")
TAGS = ("run", "gpu-only", "flags")

HEAD_ADDRESS = "10.0.0.1:6379"
"""The page's cluster address: the head node's address and GCS port."""

ROLES = ("start head", "join node", "train by --ray_address", "train by RAY_ADDRESS")
"""What the ``run`` commands of the page do, in page order; each is run by tests/multinode/test_two_node_runs.py."""


@dataclass(frozen=True)
class Command:
    """One command of the page: its words, the environment set before it in its block, its block's tag and reason,
    and the page line its block starts on."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    tag: str = "run"
    reason: str = ""
    line: int = 0

    @property
    def role(self) -> str:
        """What a ``run`` command does (one of :data:`ROLES`), or ``"other"``."""
        words = self.argv
        if words[:2] == ("ray", "start"):
            return "start head" if "--head" in words else "join node" if "--address" in words else "other"
        if words[:3] == ("python", "-m", "openrlhf_hacpo.cli.train_hacpo"):
            if "--ray_address" in words:
                return "train by --ray_address"
            if "RAY_ADDRESS" in self.env:
                return "train by RAY_ADDRESS"
        return "other"


@dataclass(frozen=True)
class Block:
    """A fenced ``bash`` block of the page: its marker's tag (None when it has no marker), the reason, its first
    line, and its commands."""

    tag: str | None
    reason: str
    line: int
    commands: tuple[Command, ...]


def logical_lines(body: Sequence[str]) -> list[str]:
    """The block's lines with ``\\`` continuations joined, blank and comment-only lines dropped."""
    out, current = [], ""
    for raw in body:
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            out.append(current.strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced ``bash`` block of the page (``text``, default docs/multinode.md) with its marker and commands."""
    lines = (DOC.read_text() if text is None else text).splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        tag = marker["tag"] if marker else None
        reason = (marker["reason"] or "") if marker else ""
        env: dict[str, str] = {}
        commands = []
        for line in logical_lines(lines[start + 1:end]):
            words = shlex.split(line, comments=True)
            if words and words[0] == "export":
                for assignment in words[1:]:
                    name, _, value = assignment.partition("=")
                    env[name] = value
                continue
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # NAME=VALUE command
                name, _, value = words.pop(0).partition("=")
                env = {**env, name: value}
            commands.append(Command(tuple(words), dict(env), tag or "", reason, start + 1))
        found.append(Block(tag, reason, start + 1, tuple(commands)))
        i = end + 1
    return found


def commands(tag: str, text: str | None = None) -> list[Command]:
    """The page's commands under marker ``tag``, in page order."""
    return [c for b in blocks(text) if b.tag == tag for c in b.commands]


def command(role: str) -> Command:
    """The page's one ``run`` command of ``role`` (:data:`ROLES`)."""
    (found,) = [c for c in commands("run") if c.role == role]
    return found


def substitute(words: Sequence[str], values: Mapping[str, str], rest: Sequence[str] = ()) -> list[str]:
    """``words`` with every placeholder of ``values`` replaced inside each word (longest placeholder first, in one
    pass) and a ``...`` word replaced by the words of ``rest`` (the flags the page leaves out)."""
    out: list[str] = []
    pattern = re.compile("|".join(re.escape(p) for p in sorted(values, key=len, reverse=True)))
    for word in words:
        if word == "...":
            out.extend(rest)
        else:  # one pass: a replacement is never searched again
            out.append(pattern.sub(lambda m: values[m.group(0)], word) if values else word)
    return out
