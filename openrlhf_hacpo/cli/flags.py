"""Command-line flags generated from config dataclasses, and the field values read back from parsed flags.

:func:`field_flags` walks a config dataclass (and the dataclasses nested in it) and lists every field that carries
command-line metadata (:func:`openrlhf_hacpo.utils.options.option`); :func:`add_flags` adds one flag per such field
to an argument parser, and :func:`field_values` reads the parsed namespace back into ``{field path: value}`` by the
same walk, so the flags and the config never need a hand-written copy of each other.

A field of a plain section (:func:`~openrlhf_hacpo.utils.options.section`, e.g. ``rollout.top_p``) is an ordinary
flag with the section's default. A field of another nested config (e.g. ``algo.loss.params.alpha``) overrides a
preset: its flag defaults to "unset", and an unset flag leaves the preset's value; its help shows the config's default
in brackets.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Iterable

from openrlhf_hacpo.utils.options import option_fields

__all__ = ["FieldFlag", "HelpFormatter", "field_flags", "add_flags", "field_values", "nest"]

UNSET = object()
"""Marks a preset-section flag that was not given."""


@dataclass(frozen=True)
class FieldFlag:
    """One config setting and its flag: ``path`` from the root dataclass (``("algo", "loss", "params", "alpha")``),
    the field, its value type (``int``, ``float``, ``str``, ``bool`` or a ``tuple[...]`` annotation), its help group,
    its option metadata, its default and whether it overrides a preset
    (:class:`~openrlhf_hacpo.utils.options.OptionField`)."""

    path: tuple[str, ...]
    field: dataclasses.Field
    kind: Any
    group: str
    meta: typing.Mapping[str, Any] = dataclasses.field(compare=False)
    default: Any = dataclasses.field(compare=False)
    overrides_preset: bool
    """A field of a nested config that is not a plain section (``algo``): the flag is unset unless given, and then
    leaves the preset's value."""

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or f"--{self.field.name}"

    @property
    def dest(self) -> str:
        return self.flag[2:]

    def value(self, args: argparse.Namespace) -> Any:
        """The field's value from the parsed flags; :data:`UNSET` for an unset flag of a preset section."""
        raw = getattr(args, self.dest)
        if self.kind is bool:
            if "false_flag" in self.meta:
                return True if raw else False if getattr(args, self.meta["false_flag"][2:]) else None
            if not raw:
                return UNSET if self.overrides_preset else self.default
            return not self.default  # the switch flips the field's default
        if raw is None:
            return UNSET if self.overrides_preset else None
        if "join" in self.meta:
            return self.meta["join"].join(raw)
        if typing.get_origin(self.kind) is tuple:
            return tuple(raw)
        if self.meta.get("zero_is_none") and raw == 0:
            return None
        return raw


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each flag's default, except for switches and flags whose default is "unset"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def field_flags(cls: type) -> list[FieldFlag]:
    """Every setting of ``cls`` (and of the dataclasses nested in it) that has a flag, in declaration order
    (:func:`~openrlhf_hacpo.utils.options.option_fields`); a nested section's fields go to the help group of the
    field holding the section unless they name their own."""
    out = []
    for of in option_fields(cls):
        if "help" not in of.meta:
            continue
        if of.kind is bool and of.default is True and "flag" not in of.meta:
            raise TypeError(f"{of.owner}.{of.field.name}: a bool field defaulting to True needs the name of the "
                            "switch that sets it False (option(flag='--no_...'))")
        out.append(FieldFlag(of.path, of.field, of.kind, of.group, of.meta, of.default, of.in_preset))
    return out


def add_flags(groups: typing.Mapping[str, argparse._ArgumentGroup], flags: Iterable[FieldFlag]) -> None:
    """Add each field's flag to its help group."""
    for ff in flags:
        group, meta = groups[ff.group], ff.meta
        help_text = f"{meta['help']} [{ff.default}]" if ff.overrides_preset and ff.kind is not bool else meta["help"]
        if ff.kind is bool:
            if "false_flag" in meta:
                pair = group.add_mutually_exclusive_group()
                pair.add_argument(meta["false_flag"], action="store_true", help=meta["false_help"])
                pair.add_argument(ff.flag, action="store_true", help=help_text)
            else:
                group.add_argument(ff.flag, action="store_true", help=help_text)
            continue
        kwargs: dict[str, Any] = {"help": help_text, "default": None if ff.overrides_preset else ff.default}
        if typing.get_origin(ff.kind) is tuple:
            item_types = typing.get_args(ff.kind)
            kwargs.update(nargs=len(item_types), type=item_types[0], default=list(ff.default))
        elif "join" in meta:
            kwargs.update(nargs="+", default=None)
        elif ff.kind is not str:
            kwargs["type"] = ff.kind
        if meta.get("required"):
            kwargs.update(required=True, default=None)
        for key in ("choices", "metavar"):
            if key in meta:
                kwargs[key] = meta[key]
        group.add_argument(ff.flag, **kwargs)


def field_values(args: argparse.Namespace, flags: Iterable[FieldFlag]) -> dict[tuple[str, ...], Any]:
    """``{field path: value}`` of every flag that gives its field a value (unset preset-section flags left out)."""
    out = {}
    for ff in flags:
        value = ff.value(args)
        if value is not UNSET:
            out[ff.path] = value
    return out


def nest(values: typing.Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """``{("algo", "loss", "alpha"): 2.0}`` -> ``{"algo": {"loss": {"alpha": 2.0}}}``."""
    out: dict[str, Any] = {}
    for path, value in values.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
