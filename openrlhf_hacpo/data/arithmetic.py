"""The shipped arithmetic task: seeded problems with exact answers, fixed splits, a verifier and a jsonl export.

Levels (operands of one problem have the same number of digits)::

    L1  a+b      a, b in 0..9          "Q: 5+7=?"
    L2  a+b      a, b in 10..99        "Q: 47+85=?"
    L3  a+b-c    a, b, c in 10..99     "Q: 47+85-39=?"     (the answer may be negative)
    L4  a+b      a, b in 100..999      "Q: 347+285=?"

Response formats (the text an agent should produce, without its EOS token):

* ``worked`` (default): the addition columns right to left, each as ``<digit>+<digit>[+1]=<column sum>`` where
  ``+1`` marks a carry-in, then ``" =<answer>"``::

      347+285  ->  "7+5=12 4+8+1=13 3+2+1=6 =632"
      5+7      ->  "5+7=12 =12"
      999+1    ->  "9+1=10 9+0+1=10 9+0+1=10 =1000"   (a missing digit is written as 0)

  L3 works the addition column by column and then does the subtraction in one step::

      47+85-39 ->  "7+5=12 4+8+1=13 132-39=93 =93"

* ``answer``: only the final segment, ``"=632"``.

Both formats end in ``=<answer>``, which is what the verifier reads (:func:`arithmetic_reward`).

Prompts: the chat form is ``[{"role": "user", "content": "Q: 347+285=?"}]`` (each agent's chat template renders
it); the raw-text form is ``"Q: 347+285=?\\nA: "``. The label is ``str(answer)``, e.g. ``"632"`` or ``"-27"``.

Splits are drawn test first, then validation, then train, each from its own seeded stream, and every split skips
the problems already taken by the earlier ones, so they are disjoint by construction and the test set does not
depend on the sizes of the other splits.

Command line (writes ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` in OpenRLHF's prompt-dataset format,
read with ``--input_key input --label_key label``)::

    python -m openrlhf_hacpo.data.arithmetic --out DIR [--prompt-form chat|text] [--seed 0] [--test-size 400] ...
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from openrlhf_hacpo.utils.atomic import atomic_write_text

__all__ = [
    "LEVELS",
    "Level",
    "get_level",
    "Problem",
    "RESPONSE_FORMATS",
    "PROMPT_FORMS",
    "TaskConfig",
    "Splits",
    "worked_addition",
    "response_text",
    "random_problem",
    "sample_problems",
    "make_splits",
    "extract_answer",
    "arithmetic_reward",
    "to_record",
    "export_jsonl",
    "main",
]

RESPONSE_FORMATS = ("worked", "answer")
PROMPT_FORMS = ("chat", "text")
SPLIT_NAMES = ("train", "validation", "test")
MAX_RESPONSE_CHARS = 2048
"""Responses longer than this are malformed for the verifier (a 40-token answer is far shorter)."""


@dataclasses.dataclass(frozen=True)
class Level:
    """One difficulty level: ``num_operands`` operands drawn uniformly from ``[low, high]``."""

    level: int
    description: str
    num_operands: int
    low: int
    high: int

    @property
    def signs(self) -> tuple[str, ...]:
        """Operators between the operands: ``a+b`` or ``a+b-c``."""
        return ("+",) if self.num_operands == 2 else ("+", "-")

    @property
    def capacity(self) -> int:
        """Number of distinct problems at this level."""
        return (self.high - self.low + 1) ** self.num_operands


LEVELS: dict[int, Level] = {
    1: Level(1, "1-digit a+b", 2, 0, 9),
    2: Level(2, "2-digit a+b", 2, 10, 99),
    3: Level(3, "2-digit a+b-c", 3, 10, 99),
    4: Level(4, "3-digit a+b", 2, 100, 999),
}


def get_level(level: int) -> Level:
    """The :class:`Level` numbered ``level``; ``ValueError`` for an unknown one."""
    if level not in LEVELS:
        raise ValueError(f"unknown arithmetic level {level!r}; known levels: {sorted(LEVELS)}")
    return LEVELS[level]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem; ``operands`` are combined left to right with the level's signs (``+``, then ``-``)."""

    level: int
    operands: tuple[int, ...]

    def __post_init__(self) -> None:
        spec = get_level(self.level)
        if len(self.operands) != spec.num_operands:
            raise ValueError(f"level {self.level} needs {spec.num_operands} operands, got {self.operands}")
        if any(not isinstance(x, int) or not spec.low <= x <= spec.high for x in self.operands):
            raise ValueError(
                f"level {self.level} operands must be ints in [{spec.low}, {spec.high}], got {self.operands}"
            )

    @property
    def expression(self) -> str:
        """``"347+285"`` or ``"47+85-39"``."""
        parts = [str(self.operands[0])]
        for sign, x in zip(get_level(self.level).signs, self.operands[1:]):
            parts.append(f"{sign}{x}")
        return "".join(parts)

    @property
    def answer(self) -> int:
        total = self.operands[0]
        for sign, x in zip(get_level(self.level).signs, self.operands[1:]):
            total = total + x if sign == "+" else total - x
        return total

    @property
    def label(self) -> str:
        return str(self.answer)

    @property
    def question(self) -> str:
        """The user message: ``"Q: 347+285=?"``."""
        return f"Q: {self.expression}=?"

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat-form prompt (rendered by the agent's chat template)."""
        return [{"role": "user", "content": self.question}]

    @property
    def prompt_text(self) -> str:
        """The raw-text prompt: ``"Q: 347+285=?\\nA: "``."""
        return f"{self.question}\nA: "

    def response(self, response_format: str = "worked") -> str:
        return response_text(self, response_format)


def worked_addition(a: int, b: int) -> str:
    """Column-by-column addition of two non-negative ints, right to left, without the final ``=answer``.

    >>> worked_addition(347, 285)
    '7+5=12 4+8+1=13 3+2+1=6'
    """
    if a < 0 or b < 0:
        raise ValueError(f"worked_addition needs non-negative operands, got {a} and {b}")
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        column = x + y + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={column}")
        carry = column // 10
    return " ".join(steps)


def response_text(problem: Problem, response_format: str = "worked") -> str:
    """The reference response of ``problem`` in ``response_format`` (``"worked"`` or ``"answer"``), without EOS."""
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}, got {response_format!r}")
    final = f"={problem.answer}"
    if response_format == "answer":
        return final
    a, b = problem.operands[:2]
    work = worked_addition(a, b)
    if len(problem.operands) == 3:
        c = problem.operands[2]
        work += f" {a + b}-{c}={a + b - c}"
    return f"{work} {final}"


# ---------------------------------------------------------------------------------------------------------------
# Sampling and splits


def random_problem(level: int, rng: random.Random) -> Problem:
    """One uniformly random problem of ``level`` (repeats possible; see :func:`sample_problems` for distinct sets)."""
    spec = get_level(level)
    return Problem(spec.level, tuple(rng.randint(spec.low, spec.high) for _ in range(spec.num_operands)))


def _all_problems(spec: Level) -> list[Problem]:
    values = range(spec.low, spec.high + 1)
    if spec.num_operands == 2:
        return [Problem(spec.level, (a, b)) for a in values for b in values]
    return [Problem(spec.level, (a, b, c)) for a in values for b in values for c in values]


def _draw_level(spec: Level, count: int, rng: random.Random, taken: set[Problem]) -> list[Problem]:
    """``count`` distinct problems of one level that are not in ``taken`` (which is extended with them)."""
    used = sum(1 for p in taken if p.level == spec.level)
    if count > spec.capacity - used:
        raise ValueError(
            f"level {spec.level} ({spec.description}) has {spec.capacity} distinct problems and {used} are already "
            f"used; cannot draw {count} more"
        )
    out: list[Problem] = []
    if spec.capacity <= 100_000 or 4 * count > spec.capacity:
        pool = _all_problems(spec)
        rng.shuffle(pool)
        for p in pool:
            if len(out) == count:
                break
            if p not in taken:
                taken.add(p)
                out.append(p)
        return out
    while len(out) < count:  # sparse draw from a large space: rejection terminates quickly
        p = random_problem(spec.level, rng)
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out


def sample_problems(
    levels: Sequence[int], count: int, seed: int | str, exclude: Iterable[Problem] = ()
) -> list[Problem]:
    """``count`` distinct problems spread evenly over ``levels`` (earlier levels take the remainder), none of them
    in ``exclude``, shuffled; deterministic in ``seed``."""
    if not levels:
        raise ValueError("levels must name at least one level")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    specs = [get_level(lv) for lv in levels]
    if len(set(levels)) != len(levels):
        raise ValueError(f"levels must not repeat, got {tuple(levels)}")
    rng = random.Random(f"arithmetic:{seed}")
    taken = set(exclude)
    out: list[Problem] = []
    for i, spec in enumerate(specs):
        n = count // len(specs) + (1 if i < count % len(specs) else 0)
        out.extend(_draw_level(spec, n, rng, taken))
    rng.shuffle(out)
    return out


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Sizes, levels and seed of the three fixed splits."""

    seed: int = 0
    train_levels: tuple[int, ...] = (4,)
    train_size: int = 10_000
    validation_levels: tuple[int, ...] = (4,)
    validation_size: int = 200
    test_levels: tuple[int, ...] = (4,)
    test_size: int = 400

    def __post_init__(self) -> None:
        for name in SPLIT_NAMES:
            levels, size = getattr(self, f"{name}_levels"), getattr(self, f"{name}_size")
            if isinstance(levels, (list, range)):
                levels = tuple(levels)
                object.__setattr__(self, f"{name}_levels", levels)  # hashable, so make_splits can cache it
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"TaskConfig.{name}_size must be an int >= 0, got {size!r}")
            if not levels or any(lv not in LEVELS for lv in levels) or len(set(levels)) != len(levels):
                raise ValueError(
                    f"TaskConfig.{name}_levels must be distinct levels from {sorted(LEVELS)}, got {levels!r}"
                )
        if self.test_size < 1:
            raise ValueError("TaskConfig.test_size must be >= 1")


@dataclasses.dataclass(frozen=True)
class Splits:
    train: tuple[Problem, ...]
    validation: tuple[Problem, ...]
    test: tuple[Problem, ...]

    def __getitem__(self, name: str) -> tuple[Problem, ...]:
        if name not in SPLIT_NAMES:
            raise KeyError(f"unknown split {name!r}; splits are {SPLIT_NAMES}")
        return getattr(self, name)

    def all_problems(self) -> frozenset[Problem]:
        return frozenset(self.train) | frozenset(self.validation) | frozenset(self.test)


@functools.lru_cache(maxsize=8)
def make_splits(cfg: TaskConfig = TaskConfig()) -> Splits:
    """The fixed train / validation / test splits of ``cfg`` (test drawn first, then validation, then train)."""
    taken: set[Problem] = set()
    drawn: dict[str, tuple[Problem, ...]] = {}
    for name in ("test", "validation", "train"):
        problems = sample_problems(
            getattr(cfg, f"{name}_levels"), getattr(cfg, f"{name}_size"), f"{cfg.seed}:{name}", exclude=taken
        )
        taken.update(problems)
        drawn[name] = tuple(problems)
    return Splits(**drawn)


# ---------------------------------------------------------------------------------------------------------------
# Verifier

_END_MARKERS = re.compile(r"(?:<\|?[^\s<>|]{1,32}\|?>)+$")


def extract_answer(response_text: object) -> str | None:
    """The answer a response gives: the text after its last ``=``, stripped, cut at the first whitespace, with
    trailing special-token markers (``</s>``, ``<|im_end|>``, ...) removed. ``None`` for anything malformed:
    not a ``str``, longer than :data:`MAX_RESPONSE_CHARS`, no ``=``, or nothing after the last ``=``."""
    if not isinstance(response_text, str) or len(response_text) > MAX_RESPONSE_CHARS:
        return None
    _, sep, tail = response_text.rpartition("=")
    tail = tail.strip()
    if not sep or not tail:
        return None
    return _END_MARKERS.sub("", tail.split(maxsplit=1)[0])


def arithmetic_reward(response_text: object, label: str | int) -> float:
    """1.0 when the response's final answer (:func:`extract_answer`) equals ``label`` exactly, else 0.0.

    Accepted: spaces around the answer (``"= 632"``), a trailing newline, an EOS marker right after it
    (``"=632</s>"``), text after whitespace (``"=632 ..."``). Rejected: a ``+`` sign (``"=+632"``), leading zeros,
    decimals (``"=632.0"``), non-ASCII digits, no ``=``, ``None`` and other non-strings, over-long responses.
    Never raises for a bad response; a bad label (empty, not str/int) raises ``ValueError``/``TypeError``.
    """
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise TypeError(f"label must be a str or int, got {type(label).__name__}")
    expected = str(label).strip()
    if not expected:
        raise ValueError("label must be a non-empty answer string")
    return 1.0 if extract_answer(response_text) == expected else 0.0


# ---------------------------------------------------------------------------------------------------------------
# Export


def to_record(problem: Problem, prompt_id: str, prompt_form: str = "chat") -> dict:
    """One OpenRLHF prompt-dataset row: ``{"input", "label", "prompt_id", "level"}``."""
    if prompt_form not in PROMPT_FORMS:
        raise ValueError(f"prompt_form must be one of {PROMPT_FORMS}, got {prompt_form!r}")
    prompt = problem.messages if prompt_form == "chat" else problem.prompt_text
    return {"input": prompt, "label": problem.label, "prompt_id": prompt_id, "level": problem.level}


def export_jsonl(
    split: str | Sequence[Problem],
    path: str | os.PathLike,
    prompt_form: str = "chat",
    cfg: TaskConfig | None = None,
) -> Path:
    """Write a split (a split name of ``make_splits(cfg)`` or a list of problems) as jsonl, atomically.

    Prompt ids are ``"<split>-<index>"`` (``"problems-<index>"`` for an explicit list)."""
    if isinstance(split, str):
        name, problems = split, make_splits(cfg or TaskConfig())[split]
    else:
        name, problems = "problems", split
    lines = [
        json.dumps(to_record(p, f"{name}-{i:05d}", prompt_form), ensure_ascii=True) for i, p in enumerate(problems)
    ]
    return atomic_write_text(Path(path), "".join(line + "\n" for line in lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_hacpo.data.arithmetic",
        description="Write the arithmetic task's train/validation/test splits as OpenRLHF prompt jsonl files "
        "(--input_key input --label_key label).",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--prompt-form", choices=PROMPT_FORMS, default="chat")
    defaults = TaskConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    for name in SPLIT_NAMES:
        parser.add_argument(f"--{name}-size", type=int, default=getattr(defaults, f"{name}_size"))
        parser.add_argument(
            f"--{name}-levels",
            type=lambda s: tuple(int(x) for x in s.split(",")),
            default=getattr(defaults, f"{name}_levels"),
            help="comma-separated levels, e.g. 1,2,4",
        )
    args = parser.parse_args(argv)
    cfg = TaskConfig(
        seed=args.seed,
        **{f"{n}_{k}": getattr(args, f"{n}_{k}") for n in SPLIT_NAMES for k in ("size", "levels")},
    )
    for name in SPLIT_NAMES:
        path = export_jsonl(name, Path(args.out) / f"{name}.jsonl", args.prompt_form, cfg)
        print(f"wrote {len(make_splits(cfg)[name])} problems to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
