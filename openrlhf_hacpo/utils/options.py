"""The rules of a config dataclass field, kept with the field itself: its command-line flag and its allowed values.

:func:`option` is :func:`dataclasses.field` plus metadata read in two places:

* the command-line builder (``openrlhf_hacpo.cli.flags``) makes one flag per field that has ``help`` and turns the
  parsed value back into the field's value. The flag's type, default and ``nargs`` come from the field's annotation
  and default: ``int`` / ``float`` / ``str`` (or ``X | None``) take one value of that type; ``bool`` defaulting to
  ``False`` is a switch that sets ``True``, ``bool`` defaulting to ``True`` a switch (named by ``flag``, e.g.
  ``--no_ray``) that sets ``False``, ``bool | None`` with ``false_flag`` two exclusive switches (``None`` when neither
  is given); ``tuple[float, float]`` takes that many values.
* :func:`check_fields`, the one walk that validates a config object: each field's value against its annotation
  (type), ``choices`` and range (``ge`` / ``gt`` / ``le`` / ``lt``, with ``also`` for values allowed outside it);
  :func:`check_only_for` refuses fields an algorithm does not use. Their errors name the flag and the field,
  ``--top_p (TrainConfig.top_p) must be <= 1, got 1.5``; a field without a flag is named by its path
  (``agents[1] ('qwen').zero_stage must be one of [0, 1, 2, 3], got 4``). ``PolicyLossConfig`` does not use this
  walk: its kernel parameters follow ``hacpo_kernels.hacpo_loss.check_loss_params``.

:func:`split_passthrough` cuts a command line at ``--``, for commands that pass the rest on (e.g. to the trainer).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable, Iterator

__all__ = ["option", "check_fields", "check_only_for", "field_label", "split_passthrough"]

_RANGE_KEYS = ("ge", "gt", "le", "lt")
_RANGE_WORDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def option(default: Any = dataclasses.MISSING, *, help: str | None = None, flag: str | None = None,
           group: str | None = None, choices: tuple | None = None, metavar: str | None = None, required: bool = False,
           false_flag: str | None = None, false_help: str | None = None, zero_is_none: bool = False,
           join: str | None = None, only_for: str | None = None, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, also: tuple | None = None, allow_inf: bool = False,
           default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its command-line flag and its allowed values.

    Flag (only fields with ``help`` get one):

    * ``help``: the flag's help text; ``flag``: its name (default ``--<field name>``); ``group``: its help section
      (nested config sections inherit the group of the field holding them); ``metavar``: the value's name in
      ``--help``; ``required``: the flag must be given.
    * ``false_flag`` / ``false_help``: for ``bool | None`` fields, the switch that sets ``False`` (``flag`` sets
      ``True``).
    * ``zero_is_none``: a value of 0 on the command line means ``None`` (e.g. "no time limit").
    * ``join``: the flag takes one or more values, joined with this separator into the field's string.

    Values (checked by :func:`check_fields` on every config whose ``validate`` runs it, whichever way the config was
    built; ``PolicyLossConfig`` uses the loss kernel's rules instead):

    * ``choices``: the allowed values (also the flag's ``choices``).
    * ``ge`` / ``gt`` / ``le`` / ``lt``: value >= / > / <= / < the bound (each element of a tuple field);
      ``also``: values allowed outside that range, e.g. ``also=(-1,)`` for "-1: never"; ``allow_inf``: a float may
      be ±inf (finite otherwise).
    * ``only_for``: the field may differ from its default only when the algorithm is ``"hacpo"`` (``"hacpo"``) or
      trains on every agent's rollouts (``"shared_rollouts"``); see :func:`check_only_for`.
    """
    meta = {"help": help, "flag": flag, "group": group, "choices": choices, "metavar": metavar, "required": required,
            "false_flag": false_flag, "false_help": false_help, "zero_is_none": zero_is_none, "join": join,
            "only_for": only_for, "ge": ge, "gt": gt, "le": le, "lt": lt, "also": also, "allow_inf": allow_inf}
    # None means "not given"; so does False for the on/off keys (a bound of 0 is kept)
    metadata = {k: v for k, v in meta.items() if v is not None and v is not False}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def field_label(field: dataclasses.Field, owner: str) -> str:
    """How an error names a field: ``--flag (Owner.field)`` when it has a flag, else ``owner.field``."""
    if "help" not in field.metadata:
        return f"{owner}.{field.name}"
    return f"{field.metadata.get('flag') or '--' + field.name} ({owner}.{field.name})"


def _fail(label: str, rule: str, value: Any) -> None:
    raise ValueError(f"{label} must be {rule}, got {value!r}")


@functools.lru_cache(maxsize=None)
def _field_kinds(cls: type) -> tuple[tuple[dataclasses.Field, Any, bool], ...]:
    """``(field, value type, None allowed)`` of each field of ``cls`` whose annotation the walk checks: ``bool``,
    ``int``, ``float``, ``str``, ``tuple[...]`` of those, each optionally ``| None``. Other fields (nested sections,
    lists of agents) are validated by their own types."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint, optional = hints[f.name], False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = len(args) < len(typing.get_args(hint))
            if len(args) != 1:
                continue
            hint = args[0]
        if hint in (bool, int, float, str) or (typing.get_origin(hint) is tuple
                                               and all(a in (bool, int, float, str) for a in typing.get_args(hint))):
            out.append((f, hint, optional))
    return tuple(out)


def _check_scalar(label: str, value: Any, kind: type, meta: typing.Mapping[str, Any]) -> None:
    """One value against its type, then (numbers) its range and (any) its choices."""
    if kind is bool:
        if not isinstance(value, bool):
            _fail(label, "a bool", value)
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(label, "an int", value)
    elif kind is float:
        allow_inf = meta.get("allow_inf", False)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
                or (math.isinf(value) and not allow_inf)):
            _fail(label, "a number" if allow_inf else "a finite number", value)
    elif kind is str:
        if not isinstance(value, str) or not value:
            _fail(label, "a non-empty string", value)
    if kind in (int, float) and value not in meta.get("also", ()):
        for key in _RANGE_KEYS:
            bound = meta.get(key)
            if bound is None:
                continue
            ok = {"ge": value >= bound, "gt": value > bound, "le": value <= bound, "lt": value < bound}[key]
            if not ok:
                also = "".join(f"{v!r} or " for v in meta.get("also", ()))
                _fail(label, f"{also}{_RANGE_WORDS[key]} {bound!r}", value)
    if "choices" in meta and value not in meta["choices"]:
        _fail(label, f"one of {list(meta['choices'])}", value)


def check_fields(obj: Any, owner: str | None = None) -> None:
    """Check every field of the dataclass instance ``obj`` against its annotation and its :func:`option` rules
    (choices, range); raises ``ValueError`` naming the first field at fault (see :func:`field_label`; ``owner``
    defaults to the class name). ``X | None`` fields may be ``None``; a ``tuple[...]`` field must hold one value of
    each listed type, each checked against the field's range. Cross-field rules stay with the config class."""
    owner = owner or type(obj).__name__
    for f, kind, optional in _field_kinds(type(obj)):
        value = getattr(obj, f.name)
        if value is None and optional:
            continue
        label = field_label(f, owner)
        if typing.get_origin(kind) is tuple:
            items = typing.get_args(kind)
            if not isinstance(value, tuple) or len(value) != len(items):
                _fail(label, f"a tuple of {len(items)} values", value)
            for item, item_kind in zip(value, items):
                try:
                    _check_scalar(label, item, item_kind, f.metadata)
                except ValueError:
                    _fail(label, _tuple_rule(items, f.metadata), value)
        else:
            _check_scalar(label, value, kind, f.metadata)


def _tuple_rule(items: tuple, meta: typing.Mapping[str, Any]) -> str:
    bounds = " and ".join(f"{_RANGE_WORDS[k]} {meta[k]!r}" for k in _RANGE_KEYS if k in meta)
    kind = "numbers" if all(i in (int, float) for i in items) else "values"
    return f"{len(items)} {kind}" + (f", each {bounds}" if bounds else "")


def _only_for_fields(obj: Any, owner: str) -> Iterator[tuple[dataclasses.Field, str, Any]]:
    """``(field, owner, value)`` of every field marked ``only_for`` in ``obj`` and the dataclasses nested in it."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _only_for_fields(value, type(value).__name__)
        elif "only_for" in f.metadata:
            yield f, owner, value


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_only_for(obj: Any, refusal: Callable[[str], str | None], algorithm: str) -> None:
    """Refuse the fields marked ``option(only_for=...)`` (in ``obj`` and its nested dataclasses) that are set to a
    value other than their default while ``refusal(only_for)`` gives a reason the algorithm does not use them.

    ``ValueError``: ``--alpha (PolicyLossConfig.alpha) is set to 2.0, but algorithm 'gspo' does not use it: <reason>``.
    """
    owner = type(obj).__name__
    for f, field_owner, value in _only_for_fields(obj, owner):
        if value == _default(f):
            continue
        why = refusal(f.metadata["only_for"])
        if why:
            raise ValueError(f"{field_label(f, field_owner)} is set to {value!r}, but algorithm {algorithm!r} does "
                             f"not use it: {why}")


def split_passthrough(argv: typing.Iterable[str]) -> tuple[list[str], list[str]]:
    """``argv`` cut at its first ``--``: (the command's own arguments, the arguments after ``--`` that it passes on,
    e.g. trainer flags); ``(argv, [])`` without a ``--``."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]
