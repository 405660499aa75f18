"""Command-line facts of a config dataclass field, kept with the field itself.

:func:`option` is :func:`dataclasses.field` plus the metadata the command-line builder
(``openrlhf_hacpo.cli.flags``) reads to make one flag per field and to turn the parsed value back into the field's
value. A field without ``help`` has no flag. The flag's type, default and ``nargs`` come from the field's annotation
and default:

* ``int`` / ``float`` / ``str`` (or ``X | None``): a flag taking one value of that type;
* ``bool`` defaulting to ``False``: a switch that sets ``True``; ``bool`` defaulting to ``True``: a switch (named by
  ``flag``, e.g. ``--no_ray``) that sets ``False``; ``bool | None`` with ``false_flag``: two exclusive switches, the
  field stays ``None`` when neither is given;
* ``tuple[float, float]``: a flag taking that many values.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["option"]


def option(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None, group: str | None = None,
           choices: tuple | None = None, metavar: str | None = None, required: bool = False,
           false_flag: str | None = None, false_help: str | None = None, zero_is_none: bool = False,
           join: str | None = None, only_for: str | None = None, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its command-line flag.

    * ``help``: the flag's help text; ``flag``: its name (default ``--<field name>``); ``group``: its help section
      (nested config sections inherit the group of the field holding them); ``choices``: the allowed values (the same
      tuple the field's validator checks); ``metavar``: the value's name in ``--help``.
    * ``required``: the flag must be given.
    * ``false_flag`` / ``false_help``: for ``bool | None`` fields, the switch that sets ``False`` (``flag`` sets
      ``True``).
    * ``zero_is_none``: a value of 0 on the command line means ``None`` (e.g. "no time limit").
    * ``join``: the flag takes one or more values, joined with this separator into the field's string.
    * ``only_for``: the flag is refused unless the algorithm is ``"hacpo"`` (``"hacpo"``) or trains on every agent's
      rollouts (``"shared_rollouts"``).
    """
    meta = {"help": help, "flag": flag, "group": group, "choices": choices, "metavar": metavar,
            "required": required, "false_flag": false_flag, "false_help": false_help, "zero_is_none": zero_is_none,
            "join": join, "only_for": only_for}
    metadata = {k: v for k, v in meta.items() if v not in (None, False)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)
