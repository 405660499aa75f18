"""Fuzzing the agent settings: ``--agent key=value,...`` strings and ``--agents_config`` YAML files.

Property: an agent spec gives an :class:`AgentConfig` holding exactly the values written, or ``ValueError`` naming
the spec (``--agent '...'``) or the file and entry, and the setting at fault; never a raw exception.
"""
from __future__ import annotations

import itertools
import math
import typing

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from openrlhf_hacpo.cli.train_hacpo import load_agents_file, parse_agent_spec
from openrlhf_hacpo.config import AGENT_FIELDS, AgentConfig

from fuzz_support import fuzz, message_names

_COUNTER = itertools.count()
_HINTS = typing.get_type_hints(AgentConfig)
KINDS = {name: next(a for a in (typing.get_args(_HINTS[name]) or (_HINTS[name],)) if a is not type(None))
         for name in AGENT_FIELDS}
SPEC_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x7E, blacklist_characters=","), max_size=8)
VALUE_TEXT = st.one_of(SPEC_TEXT, st.sampled_from(["1", "0", "-1", "2", "3", "1e-6", "nan", "inf", "true", "no",
                                                   "qwen", "/m/x", "sdpa", ""]))


@given(items=st.lists(st.tuples(st.sampled_from([*AGENT_FIELDS, "nme", "lr", ""]), VALUE_TEXT), max_size=6),
       junk=st.sampled_from(["", ",", ",,", ",novalue", ", name = b "]))
@example(items=[("name", "a"), ("pretrain", "/m"), ("learning_rate", "nan")], junk="")
@example(items=[("name", "a"), ("pretrain", "/m"), ("zero_stage", "4")], junk="")
@fuzz()
def test_agent_specs_give_the_values_written_or_name_the_setting(items, junk):
    spec = ",".join(f"{k}={v}" for k, v in items) + junk
    try:
        agent = parse_agent_spec(spec)
    except ValueError as err:
        message_names(err, f"--agent {spec!r}")
        return
    written = {key.strip(): text for key, _, text in (item.partition("=") for item in spec.split(",")
                                                       if item.strip())}
    assert set(written) <= set(AGENT_FIELDS) and {"name", "pretrain"} <= set(written)
    for key, text in written.items():
        held = getattr(agent, key)
        kind = KINDS[key]
        if kind is float:
            assert held == float(text) and math.isfinite(held)
        elif kind is int:
            assert held == int(text)
        elif kind is bool:
            assert held == (text.strip().lower() in ("1", "true", "yes", "on"))
        else:
            assert held == text.strip() and held


YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=True), st.text(max_size=6),
                         st.sampled_from(["qwen", "/m/q", "1e-6", "1.0e-6", "sdpa"]))
YAML_VALUES = st.recursive(YAML_SCALARS, lambda inner: st.lists(inner, max_size=2)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=2), max_leaves=4)
ENTRY = st.dictionaries(st.sampled_from([*AGENT_FIELDS, "nmae"]) | st.integers(0, 3), YAML_VALUES, max_size=5)
GOOD_ENTRY = st.fixed_dictionaries({"name": st.sampled_from(["a", "b.c", "Q-1"]), "pretrain": st.just("/m/x")},
                                   optional={"learning_rate": st.floats(0, 1), "zero_stage": st.sampled_from([0, 3]),
                                             "bf16": st.booleans(), "dp_size": st.integers(1, 4)})


def _file(tmp_path, data: bytes):
    path = tmp_path / f"agents{next(_COUNTER)}.yaml"
    path.write_bytes(data)
    return path


@given(entries=st.lists(GOOD_ENTRY | ENTRY, max_size=3), top=st.sampled_from(["list", "mapping", "extra_key"]))
@fuzz()
def test_agents_yaml_of_any_shape_gives_the_agents_or_names_the_entry(tmp_path, entries, top):
    data = entries if top == "list" else {"agents": entries, **({7: "x"} if top == "extra_key" else {})}
    path = _file(tmp_path, yaml.safe_dump(data, allow_unicode=True).encode())
    try:
        agents = load_agents_file(str(path))
    except ValueError as err:
        message_names(err, f"agents config {path}")
        return
    assert top != "extra_key" and len(agents) == len(entries)
    for agent, entry in zip(agents, entries):
        assert {k: getattr(agent, k) for k in entry} == entry


@given(raw=st.binary(max_size=120) | st.text(max_size=120).map(str.encode))
@example(raw=b"- name: caf\xe9\n  pretrain: /m\n")
@example(raw=b"[" * 3000 + b"]" * 3000)
@example(raw=b"{1: 2, agents: []}")
@example(raw=b"- {1: x, name: a, pretrain: /m}")
@fuzz()
def test_agents_yaml_bytes_load_or_name_the_file(tmp_path, raw):
    path = _file(tmp_path, raw)
    try:
        agents = load_agents_file(str(path))
    except ValueError as err:
        message_names(err, f"agents config {path}")
        return
    assert agents and all(isinstance(a, AgentConfig) for a in agents)


@pytest.mark.parametrize("raw, names", [
    (b"- name: a\n  pretrain: /m\n  learning_rate: caf\xe9\n", [":3:", "UTF-8"]),
    (b"[" * 3000 + b"]" * 3000, ["invalid YAML", "nesting depth"]),
    (b"- {1: x, name: a, pretrain: /m}\n", ["entry 0", "unknown agent setting(s) [1]"]),
])
def test_agents_yaml_regressions(tmp_path, raw, names):
    """Used to be raw UnicodeDecodeError / RecursionError / TypeError (sorting int and str keys)."""
    path = _file(tmp_path, raw)
    with pytest.raises(ValueError) as info:
        load_agents_file(str(path))
    message_names(info.value, f"agents config {path}", *names)
