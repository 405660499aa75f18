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
  :func:`check_only_for` refuses fields an algorithm does not use. Their errors name the flag and the field by its
  path, ``--top_p (TrainConfig.rollout.top_p) must be <= 1, got 1.5``; a field without a flag is named by its path
  alone (``agents[1] ('qwen').zero_stage must be one of [0, 1, 2, 3], got 4``). ``PolicyLossConfig`` does not use
  this walk: its kernel parameters follow ``hacpo_kernels.hacpo_loss.check_loss_params``.

A config is a tree of dataclasses. :func:`section` marks a field that holds a plain part of its config (e.g.
``TrainConfig.rollout``): its fields are the config's own settings, named by their path. Any other nested dataclass
is a config of its own whose fields override a preset (``TrainConfig.algo``). A class that cannot carry option
metadata (the loss kernel's ``LossParams``) gets it from the field that holds it (``option_fields`` of
:func:`nested`). :func:`option_fields` is the one walk over that tree that the flags and :func:`check_only_for` read.

:func:`split_passthrough` cuts a command line at ``--``, for commands that pass the rest on (e.g. to the trainer).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator

__all__ = ["option", "section", "nested", "OptionField", "option_fields", "check_fields", "check_only_for",
           "field_label", "option_label", "split_passthrough"]

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


def section(cls: type, *, group: str | None = None) -> Any:
    """A field holding a plain section of its config (a dataclass built by default): the section's fields are the
    config's own settings, flags included (their defaults are the section's, not a preset's), named by their path
    (``TrainConfig.rollout.top_p``); ``group`` is the help section of its flags unless a field names its own."""
    metadata: dict[str, Any] = {"section": True}
    if group is not None:
        metadata["group"] = group
    return dataclasses.field(default_factory=cls, metadata=metadata)


def nested(default_factory: Callable[[], Any], option_fields: typing.Mapping[str, dataclasses.Field]) -> Any:
    """A field holding a dataclass that cannot carry option metadata itself (a class of another package, e.g. the
    loss kernel's ``LossParams``): ``option_fields`` maps some of its field names to an :func:`option` (only the
    metadata is read: flag, help, ``only_for``, ...); its other fields have no flag. The held fields are named by
    their path (``PolicyLossConfig.params.delta``)."""
    fields = {name: f.metadata for name, f in option_fields.items()}
    return dataclasses.field(default_factory=default_factory, metadata={"fields": fields})


def field_label(field: dataclasses.Field, owner: str) -> str:
    """How an error names a field: ``--flag (Owner.field)`` when it has a flag, else ``owner.field``."""
    return option_label(field.metadata, field.name, owner)


def option_label(meta: typing.Mapping[str, Any], name: str, owner: str) -> str:
    """:func:`field_label` of a field named ``name`` whose option metadata is ``meta``."""
    if "help" not in meta:
        return f"{owner}.{name}"
    return f"{meta.get('flag') or '--' + name} ({owner}.{name})"


@dataclass(frozen=True)
class OptionField:
    """One setting of a config tree (:func:`option_fields`): a field that does not hold a dataclass.

    ``path`` from the root (``("algo", "loss", "params", "delta")``), the ``field``, its value type ``kind`` (the
    annotation without ``| None``), its option ``meta``, its ``default`` in the default of the section holding it,
    its ``owner`` as errors name it (``TrainConfig.rollout``, ``PolicyLossConfig.params``), its help ``group`` and
    whether it overrides a preset (``in_preset``: it sits in a nested config that is not a plain :func:`section`)."""

    path: tuple[str, ...]
    field: dataclasses.Field
    kind: Any
    meta: typing.Mapping[str, Any] = dataclasses.field(compare=False)
    default: Any = dataclasses.field(compare=False)
    owner: str
    group: str | None
    in_preset: bool

    @property
    def label(self) -> str:
        """``--flag (Owner.field)``, or ``Owner.field`` without a flag."""
        return option_label(self.meta, self.field.name, self.owner)

    def value(self, root: Any) -> Any:
        """The setting's value in ``root`` (an instance of the walked class)."""
        for name in self.path:
            root = getattr(root, name)
        return root


@functools.lru_cache(maxsize=None)
def option_fields(cls: type) -> tuple[OptionField, ...]:
    """Every setting of the config class ``cls`` and of the dataclasses nested in it, in declaration order."""
    return tuple(_option_fields(cls, cls.__name__, (), None, False, dataclasses.MISSING, None))


def _option_fields(cls: type, owner: str, path: tuple[str, ...], group: str | None, in_preset: bool, defaults: Any,
                   metas: typing.Mapping[str, typing.Mapping[str, Any]] | None) -> Iterator[OptionField]:
    """A field whose default is a dataclass instance holds a nested config (walked, its defaults read from that
    instance); the others are settings, whose value type the class's annotations give (read only then, so a class
    holding only nested configs may name classes its module cannot resolve)."""
    hints = None
    for f in dataclasses.fields(cls):
        meta = f.metadata if metas is None else metas.get(f.name, {})
        default = _default(f) if defaults is dataclasses.MISSING else getattr(defaults, f.name)
        field_group = meta.get("group", group)
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            plain = bool(meta.get("section"))
            inner = f"{owner}.{f.name}" if plain or "fields" in meta else type(default).__name__
            yield from _option_fields(type(default), inner, path + (f.name,), field_group, in_preset or not plain,
                                      default, meta.get("fields"))
        else:
            hints = typing.get_type_hints(cls) if hints is None else hints
            yield OptionField(path + (f.name,), f, _value_type(hints[f.name]), meta, default, owner, field_group,
                              in_preset)


def _value_type(hint: Any) -> Any:
    """``int | None`` -> ``int``; other annotations unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


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


def _default(f: dataclasses.Field) -> Any:
    """The field's default (``MISSING`` for a required field)."""
    if f.default is not dataclasses.MISSING or f.default_factory is dataclasses.MISSING:
        return f.default
    return f.default_factory()


def check_only_for(obj: Any, refusal: Callable[[str], str | None], algorithm: str) -> None:
    """Refuse the fields marked ``option(only_for=...)`` (in ``obj`` and its nested dataclasses) that are set to a
    value other than their default while ``refusal(only_for)`` gives a reason the algorithm does not use them.

    ``ValueError``: ``--alpha (PolicyLossConfig.params.alpha) is set to 2.0, but algorithm 'gspo' does not use it:
    <reason>``.
    """
    for of in option_fields(type(obj)):
        if "only_for" not in of.meta:
            continue
        value = of.value(obj)
        if value == of.default:
            continue
        why = refusal(of.meta["only_for"])
        if why:
            raise ValueError(f"{of.label} is set to {value!r}, but algorithm {algorithm!r} does not use it: {why}")


def split_passthrough(argv: typing.Iterable[str]) -> tuple[list[str], list[str]]:
    """``argv`` cut at its first ``--``: (the command's own arguments, the arguments after ``--`` that it passes on,
    e.g. trainer flags); ``(argv, [])`` without a ``--``."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]
