"""Flags generated from the config dataclasses: the same flags and the same configs as the hand-written parser they
replace, and the generator's rules on a small dataclass of its own.

``tests/testdata/train_hacpo_flags.json`` (every flag's option strings, dest, action, default, type, choices, nargs,
const, required, metavar, help group and exclusive partners) and ``tests/testdata/train_hacpo_configs.json`` (the
``dataclasses.asdict`` of ``build_config`` and the resume fingerprint for the Table 1 launcher's 15 command lines,
the tiny main job's command for five algorithms, the 2-GPU smoke test's, and command lines that set every flag) were
captured with the hand-written parser and ``build_config`` of commit 7009847. The captured configs are in the flat
layout of that time: they are compared after ``TrainConfig.from_dict`` reads them into today's sections (as it reads
any config saved flat).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from openrlhf_hacpo.cli.flags import HelpFormatter, add_flags, field_flags, field_values, nest
from openrlhf_hacpo.cli.train_hacpo import build_config, build_parser
from openrlhf_hacpo.config import FLAT_NAMES, SECTIONS, TrainConfig
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint
from openrlhf_hacpo.utils.options import option, split_passthrough

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
FORMER_CONFIGS = json.loads((TESTDATA / "train_hacpo_configs.json").read_text())
INTENDED_FLAG_CHANGES: dict[str, dict] = {  # dest -> {key: new value}, each with its reason
    # a third EOS policy, the main-branch code's: foreign text decoded with its special tokens (default unchanged)
    "eos_policy": {"choices": ["drop", "keep", "text"]},
    # a third rollout backend: transformers generate in an engine actor beside the policy (default unchanged)
    "rollout_backend": {"choices": ["hf", "hf_engine", "vllm"]},
    # the two readings of the paper's Naive baseline, each named for what it does ("naive" stays: naive-gated's
    # older name, so saved configs and commands load)
    "algorithm": {"choices": ["hacpo", "gspo", "grpo", "naive", "naive-paper", "naive-gated", "hacpo-no-adv",
                              "hacpo-no-omega", "hacpo-no-clip", "hacpo-no-stepwise"]},
}
ADDED_FLAGS = {
    "dual_clip_c": "GRPO's dual clip c = 3 (verl clip_ratio_c): an algorithm setting, in the fingerprint",
    "no_skip_zero_grad_rows": "foreign rows with zero gradient leave the backward pass unless this is given: same "
                              "result, not fingerprinted",
    "no_length_grouping": "micro-batches grouped by length unless this is given: same result, not fingerprinted",
    "no_final_checkpoint": "a joint checkpoint at the end unless this is given: an output choice, not fingerprinted",
    "allow_straddle": "a layout that splits a DeepSpeed group or a TP engine across nodes is refused unless this is "
                      "given: placement only, not fingerprinted",
    **{flag: "LoRA agents, off by default (lora_rank 0): fingerprinted only for an agent that uses LoRA"
       for flag in ("lora_rank", "lora_alpha", "lora_dropout", "target_modules")},
    **{flag: "memory options, off by default: where states live, same updates within float tolerance, not "
             "fingerprinted"
       for flag in ("adam_offload", "param_offload", "deepspeed_enable_sleep", "ref_reward_offload")},
    "old_logp_from_update": "own rows' old log-probs from the first update's forward instead of a scoring pass, off "
                            "by default: same result within float noise, not fingerprinted",
    "gpu_memory_gb": "the GPU size the memory plan checks against: a launch check only, not fingerprinted",
    "no_memory_check": "the memory plan refuses a layout it estimates too large unless this is given: a launch check "
                       "only, not fingerprinted",
    "one_step_off": "generation overlapped with training, off by default: fingerprinted only when given",
    "own_old_logp": "own rows' old log-probs with one_step_off, auto by default (behaviour at temperature 1): "
                    "fingerprinted, as resolved, with one_step_off",
    "vllm_cpu_single_process": "vllm-cpu engines in their actors' processes, off by default: the engines' process "
                               "layout only, not fingerprinted",
    "no_mismatch_metrics": "the mismatch/* metrics (engine vs trainer log-probs) unless this is given: metrics only, "
                           "the same tokens and updates, not fingerprinted",
    "mismatch_alarm": "stops a run whose engines and learner disagree (a broken weight sync): a check only, the same "
                      "updates while it runs, not fingerprinted",
    **{flag: "the training-inference correction (verl's rollout_is settings), off by default: fingerprinted only "
             "when --rollout_is is given"
       for flag in ("rollout_is", "rollout_is_level", "rollout_is_mode", "rollout_is_threshold",
                    "rollout_is_threshold_lower")},
    "engine_dtype": "the engines' precision, auto = the policy's (what every run did before): fingerprinted only where "
                    "it differs from the policy's",
}
"""Flags added since the fixture was captured, each with its reason."""
ADDED_FIELDS = {"algo.loss.dual_clip_c": 3.0, "skip_zero_grad_rows": True, "length_grouping": True,
                "save_final_checkpoint": True, "allow_straddle": False,
                "lora_rank": 0, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear",
                "adam_offload": False, "param_offload": False, "deepspeed_enable_sleep": False,
                "ref_reward_offload": False, "gpu_memory_gb": None, "memory_check": True,
                "old_logp_from_update": False, "one_step_off": False, "own_old_logp": "auto",
                "vllm_cpu_single_process": False, "mismatch_metrics": True, "mismatch_alarm": None,
                "algo.loss.rollout_is": False, "algo.loss.rollout_is_level": "sequence",
                "algo.loss.rollout_is_mode": "truncate", "algo.loss.rollout_is_threshold": 2.0,
                "algo.loss.rollout_is_threshold_lower": None, "engine_dtype": "auto"}
ADDED_AGENT_FIELDS = {"node": None, "engine_dtype": None,  # pins an agent to a node (placement only, not fingerprinted)
                      "lora_rank": None, "lora_alpha": None, "lora_dropout": None, "target_modules": None,
                      "adam_offload": None, "param_offload": None, "deepspeed_enable_sleep": None,
                      "ref_reward_offload": None}
REMOVED_FIELDS = ("algo.loss.gspo_form",)  # read by no code: GSPO-token has the sequence form's value and gradient
FINGERPRINTED = ("algo.loss.dual_clip_c",)


def former_config_now(config: dict) -> dict:
    """A captured config with the fields added or removed since (each listed above with its reason)."""
    config = json.loads(json.dumps(config))
    for path, value in ADDED_FIELDS.items():
        *parents, name = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[name] = value
    for agent in config["agents"]:
        agent.update(ADDED_AGENT_FIELDS)
    for path in REMOVED_FIELDS:
        *parents, name = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node.pop(name)
    return config


def former_fingerprint_now(fingerprint: dict) -> dict:
    out = {k: v for k, v in fingerprint.items() if k not in REMOVED_FIELDS}
    out.update({k: ADDED_FIELDS[k] for k in FINGERPRINTED})
    return out


def describe_flags(parser: argparse.ArgumentParser) -> list[dict]:
    """What a command line can say to ``parser``: every flag but ``--help``, as plain values."""
    groups = {a.dest: g.title for g in parser._action_groups for a in g._group_actions}
    partners = {a.dest: sorted(x.option_strings[0] for x in m._group_actions)
                for m in parser._mutually_exclusive_groups for a in m._group_actions}
    return [{
        "option_strings": a.option_strings, "dest": a.dest, "action": type(a).__name__,
        "default": list(a.default) if isinstance(a.default, tuple) else a.default,
        "type": a.type.__name__ if a.type is not None else None,
        "choices": list(a.choices) if a.choices is not None else None,
        "nargs": a.nargs, "const": a.const, "required": a.required, "metavar": a.metavar,
        "group": groups.get(a.dest), "exclusive_with": partners.get(a.dest),
    } for a in parser._actions if a.dest != "help"]


def test_every_former_flag_is_accepted_unchanged():
    former = {f["dest"]: f for f in json.loads((TESTDATA / "train_hacpo_flags.json").read_text())}
    now = {f["dest"]: f for f in describe_flags(build_parser())}
    assert sorted(now) == sorted(set(former) | set(ADDED_FLAGS)), "flags added or removed"
    for dest, flag in former.items():
        expected = {**flag, **INTENDED_FLAG_CHANGES.get(dest, {})}
        assert now[dest] == expected, dest


@pytest.mark.parametrize("case", sorted(FORMER_CONFIGS))
def test_command_lines_build_the_former_configs_and_fingerprints(case):
    former = FORMER_CONFIGS[case]
    cfg = build_config(former["argv"])
    flat = former_config_now(former["config"])
    assert set(flat) - {"agents", "algo"} == set(FLAT_NAMES)  # every setting, each once
    assert set(flat["algo"]["loss"]) == set(cfg.algo.loss.settings())
    assert cfg == TrainConfig.from_dict(flat)  # the flat layout, read into the sections
    assert json.loads(json.dumps(config_fingerprint(cfg))) == former_fingerprint_now(former["fingerprint"])


def test_every_run_setting_has_a_flag_with_help():
    flags = field_flags(TrainConfig)
    settings = {ff.path for ff in flags if ff.path[0] != "algo"}
    assert settings == {(name, f.name) for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert all(ff.meta["help"].strip() and ff.group for ff in flags)
    assert len({ff.flag for ff in flags}) == len(flags)


# ------------------------------------------------------------------------------------------ the generator's rules
@dataclass
class Section:
    rate: float = option(0.5, help="a rate")
    on: bool = option(True, flag="--no_on", help="switch off")


@dataclass
class Toy:
    name: str = option("x", group="main", help="a name")
    size: int | None = option(None, group="main", help="a size")
    fast: bool = option(False, group="main", help="go fast")
    kept: bool = option(True, flag="--drop", group="main", help="drop it")
    eager: bool | None = option(None, group="main", help="eager", false_flag="--lazy", false_help="lazy")
    timeout: float | None = option(30.0, group="main", zero_is_none=True, help="seconds (0: none)")
    files: str | None = option(None, group="main", join=",", help="files")
    pair: tuple[float, float] = option((0.1, 0.2), group="main", help="two numbers")
    mode: str = option("a", group="main", choices=("a", "b"), help="a mode")
    hidden: int = 3
    bounded: float = option(0.0, ge=0)  # a range but no help: no flag
    section: Section = field(default_factory=Section, metadata={"group": "main"})


def parse_toy(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    flags = field_flags(Toy)
    add_flags({"main": parser.add_argument_group("main")}, flags)
    return nest(field_values(parser.parse_args(argv), flags))


def test_defaults_and_unset_preset_section():
    assert parse_toy([]) == {"name": "x", "size": None, "fast": False, "kept": True, "eager": None,
                             "timeout": 30.0, "files": None, "pair": (0.1, 0.2), "mode": "a"}


def test_each_kind_of_flag_reads_back_to_the_field_value():
    values = parse_toy(["--name", "y", "--size", "4", "--fast", "--drop", "--lazy", "--timeout", "0",
                        "--files", "a.jsonl", "b.jsonl", "--pair", "0.9", "0.95", "--mode", "b",
                        "--rate", "2", "--no_on"])
    assert values == {"name": "y", "size": 4, "fast": True, "kept": False, "eager": False, "timeout": None,
                      "files": "a.jsonl,b.jsonl", "pair": (0.9, 0.95), "mode": "b",
                      "section": {"rate": 2.0, "on": False}}
    assert parse_toy(["--eager", "--timeout", "5"])["eager"] is True
    assert parse_toy(["--timeout", "5"])["timeout"] == 5.0


@pytest.mark.parametrize("argv", [["--eager", "--lazy"], ["--mode", "c"], ["--size", "x"], ["--hidden", "1"],
                                  ["--bounded", "1"]])
def test_bad_flags_are_refused(argv):
    with pytest.raises(SystemExit):
        parse_toy(argv)


def test_a_true_default_switch_needs_its_name():
    @dataclass
    class Bad:
        on: bool = option(True, help="?")

    with pytest.raises(TypeError, match="Bad.on"):
        field_flags(Bad)


def test_help_shows_defaults_only_where_they_say_something(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: False)" not in text and "(default: None)" not in text
    assert "--top_k TOP_K -1 disables (default: -1)" in text
    assert "exponential importance-sampling exponent α (eq. 12) [1.0]" in text  # the dataclass default


@pytest.mark.parametrize("argv, own, passed", [
    ([], [], []),
    (["--config", "model"], ["--config", "model"], []),
    (["--rounds", "2", "--", "--micro_train_batch_size", "32"], ["--rounds", "2"], ["--micro_train_batch_size", "32"]),
    (["--", "--a", "--", "--b"], [], ["--a", "--", "--b"]),  # only the first -- cuts
    (["run", "--"], ["run"], []),
])
def test_split_passthrough_cuts_at_the_first_double_dash(argv, own, passed):
    assert split_passthrough(argv) == (own, passed)
