"""Train N heterogeneous agents together with HACPO (or a single-agent baseline) from one command.

    python -m openrlhf_hacpo.cli.train_hacpo \\
        --agent name=qwen,pretrain=Qwen/Qwen3-1.7B-Base \\
        --agent name=qwen4b,pretrain=Qwen/Qwen3-4B-Base,learning_rate=1e-6 \\
        --prompt_data data/train.jsonl --input_key input --label_key label --apply_chat_template \\
        --algorithm hacpo --n_samples_per_prompt 8 --rollout_batch_size 128 --train_batch_size 512 \\
        --rollout_backend vllm --vllm_num_engines 2 --save_path runs/qwen_pair

Flag names follow OpenRLHF where the meaning is the same. Every flag but ``--agent``, ``--agents_config``,
``--algorithm`` (a preset, :meth:`~openrlhf_hacpo.algorithms.HACPOConfig.preset`) and ``--debug`` is generated from a
field of :class:`~openrlhf_hacpo.config.TrainConfig` or of its algorithm sections (:mod:`openrlhf_hacpo.cli.flags`);
the algorithm flags override the preset's values. Per-agent settings come from repeatable ``--agent
key=value,...`` strings or an ``--agents_config`` YAML file (a list of agents, or a mapping with an ``agents`` list);
settings an agent leaves out inherit the run-wide flag of the same meaning. :func:`build_config` turns ``argv`` into
a validated :class:`~openrlhf_hacpo.config.TrainConfig`; :func:`run` trains and returns the controller.

:func:`main` (the console entry point) prints every error a person can act on (bad flags and files, a refused run
folder, checkpoint and disk-space errors, a reward function that fails, a worker that dies or hangs) as one line and
exits with status 2 (the line is also appended to ``<save_path>/train.log`` once the run logs there; a worker that
dies or hangs is named by agent, worker, node and phase with the command that resumes,
:mod:`openrlhf_hacpo.trainer.failures`); ``--debug`` prints the traceback too. SIGINT and SIGTERM stop the workers and the Ray session
before the process exits (status 130 / 143).
"""
from __future__ import annotations

import argparse
import sys
import traceback
import typing
from pathlib import Path
from typing import Any, Sequence

from openrlhf_hacpo.algorithms import PRESETS, HACPOConfig
from openrlhf_hacpo.cli.flags import FieldFlag, HelpFormatter, add_flags, field_flags, field_values, nest
from openrlhf_hacpo.config import AGENT_FIELDS, AgentConfig, TrainConfig, only_for_refusal

__all__ = ["build_parser", "build_config", "parse_agent_spec", "load_agents_file", "run", "main"]


def _bool_text(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def _agent_field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(AgentConfig)
    out = {}
    for name in AGENT_FIELDS:
        args = [a for a in typing.get_args(hints[name]) if a is not type(None)] or [hints[name]]
        out[name] = args[0]
    return out


def parse_agent_spec(spec: str, where: str = "--agent") -> AgentConfig:
    """``"name=qwen,pretrain=/models/qwen,learning_rate=1e-6,zero_stage=2"`` -> :class:`AgentConfig`."""
    types = _agent_field_types()
    values: dict[str, Any] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{where} {spec!r}: {item!r} is not key=value")
        if key not in types:
            raise ValueError(f"{where} {spec!r}: unknown agent setting {key!r}; known settings: {list(AGENT_FIELDS)}")
        if key in values:
            raise ValueError(f"{where} {spec!r}: setting {key!r} given twice")
        kind = types[key]
        try:
            if kind is bool:
                values[key] = _bool_text(text)
            elif kind is int:
                values[key] = int(text)
            elif kind is float:
                values[key] = float(text)
            else:
                values[key] = text.strip()
        except ValueError as err:
            raise ValueError(f"{where} {spec!r}: bad value for {key!r}: {err}") from None
    return AgentConfig.from_dict(values, where=f"{where} {spec!r}")


def load_agents_file(path: str) -> list[AgentConfig]:
    """Agents from a YAML file: a list of agent mappings, or a mapping with an ``agents`` list."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"agents config {path} does not exist")
    try:
        # libyaml's loader when built in: same documents, linear time on deep nesting (the Python one is quadratic)
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        raise ValueError(f"agents config {path}:{line}: byte 0x{err.object[err.start]:02x} is not valid UTF-8 (YAML "
                         "files must be UTF-8 encoded)") from None
    except yaml.YAMLError as err:
        raise ValueError(f"agents config {path}: invalid YAML ({err})") from err
    except RecursionError:
        raise ValueError(f"agents config {path}: invalid YAML (lists or mappings nested too deeply to parse)") from None
    if isinstance(data, dict):
        unknown = sorted((key for key in data if key != "agents"), key=str)
        if unknown:
            raise ValueError(f"agents config {path}: unknown top-level key(s) {unknown}; expected 'agents'")
        data = data.get("agents")
    if not isinstance(data, list) or not data:
        raise ValueError(f"agents config {path}: expected a non-empty list of agents")
    agents = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ValueError(f"agents config {path}: entry {i} must be a mapping, got {type(entry).__name__}")
        agents.append(AgentConfig.from_dict(entry, where=f"agents config {path}, entry {i}"))
    return agents


_GROUPS = {  # help sections in --help order, with their descriptions
    "agents": None,
    "prompts": None,
    "rollout": None,
    "rewards": None,
    "algorithm": "HACPO settings (defaults follow the official code; docs/algorithm.md, section 5)",
    "training": None,
    "memory": "LoRA, offloading and sleep: larger agents on the same GPUs (docs/gpu.md)",
    "checkpoints and logging": None,
    "evaluation": "greedy accuracy of each agent alone, and pass@k",
    "reliability and network": None,
}
_FLAGS = field_flags(TrainConfig)


def build_parser() -> argparse.ArgumentParser:
    """The grouped argument parser of ``train_hacpo``: one flag per :class:`TrainConfig` field (nested algorithm
    sections included) plus the agent, preset and debug flags."""
    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_hacpo.cli.train_hacpo",
        usage="%(prog)s --agent name=NAME,pretrain=MODEL [--agent ...] --prompt_data FILE [flags below]",
        description="Heterogeneous Agent Collaborative Policy Optimization: N agents with different architectures, "
        "sizes and tokenizers learn one verifiable-reward task together on Ray + DeepSpeed.",
        formatter_class=HelpFormatter,
    )
    groups = {title: parser.add_argument_group(title, description) for title, description in _GROUPS.items()}
    groups["agents"].add_argument(
        "--agent", action="append", default=[], metavar="KEY=VALUE,...",
        help="one agent per flag (repeatable), e.g. name=qwen,pretrain=/models/qwen,learning_rate=1e-6. "
        f"Settings: {', '.join(AGENT_FIELDS)}; unset settings inherit the run-wide flag")
    groups["agents"].add_argument(
        "--agents_config", default=None, metavar="YAML",
        help="YAML file with a list of agents (same settings as --agent); combined with --agent flags")
    groups["algorithm"].add_argument(
        "--algorithm", choices=PRESETS, default="hacpo",
        help="hacpo; the baselines gspo / grpo (each agent alone) and naive (shared rollouts, plain advantages); "
        "or a HACPO ablation. The flags below override the preset's settings")
    add_flags(groups, _FLAGS)
    groups["reliability and network"].add_argument(
        "--debug", action="store_true", help="print tracebacks with error messages; debug logging")
    return parser


def _check_algorithm_flags(preset: HACPOConfig, name: str, given: Sequence[FieldFlag]) -> None:
    """Refuse the algorithm flags given on the command line that ``preset`` has no use for, even at their default
    value (the config itself refuses such fields only when they differ from the default: see
    :func:`~openrlhf_hacpo.config.only_for_refusal`)."""
    refused = [(ff.flag, why) for ff in given if "only_for" in ff.meta
               for why in [only_for_refusal(preset, ff.meta["only_for"])] if why]
    if refused:
        raise ValueError(f"--algorithm {name} is incompatible with {', '.join(f for f, _ in refused)}: "
                         f"{refused[0][1]}")


def build_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse ``argv`` into a validated :class:`TrainConfig` (``ValueError`` names what is wrong)."""
    args = build_parser().parse_args(argv)
    agents = load_agents_file(args.agents_config) if args.agents_config else []
    agents += [parse_agent_spec(spec) for spec in args.agent]
    if not agents:
        raise ValueError("no agents: give at least one --agent name=...,pretrain=... or an --agents_config file")
    values = field_values(args, _FLAGS)
    preset = HACPOConfig.preset(args.algorithm)
    given = [ff for ff in _FLAGS if ff.overrides_preset and ff.path in values]
    _check_algorithm_flags(preset, args.algorithm, given)
    config = nest(values)
    algo = HACPOConfig.from_dict({"algorithm": args.algorithm, **config.pop("algo", {})})
    return TrainConfig.from_dict({"agents": agents, "algo": algo, **config})


def run(argv: Sequence[str] | None = None):
    """Build the config, train, and return the finished :class:`~openrlhf_hacpo.trainer.HACPOController`."""
    from openrlhf_hacpo.trainer.controller import HACPOController

    controller = HACPOController(build_config(argv))
    _fit(controller)
    return controller


def _fit(controller) -> None:
    """Train, then stop the workers and Ray whatever happened."""
    try:
        controller.fit()
    finally:
        controller.close()


def _known_errors() -> tuple[type[BaseException], ...]:
    from openrlhf_hacpo.rollout.reward_fns import RewardFunctionError
    from openrlhf_hacpo.trainer.controller import TrainingError
    from openrlhf_hacpo.utils.errors import USER_ERRORS

    return (*USER_ERRORS, RewardFunctionError, TrainingError)


def _one_line(err: BaseException) -> str:
    """The error's message on one line; an error raised inside a Ray worker is reported by its cause, without the
    remote traceback Ray prepends."""
    cause = getattr(err, "cause", None)
    if type(err).__name__.startswith("RayTaskError") and isinstance(cause, BaseException):
        err = cause
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: 0 on success; 2 on an error a person can act on (one line on stderr, ``--debug`` adds the
    traceback); 128 + the signal number when stopped by SIGINT or SIGTERM (workers and Ray are stopped first)."""
    from openrlhf_hacpo.utils.logging_setup import configure_logging
    from openrlhf_hacpo.utils.shutdown import RunInterrupted, signals_raise

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    configure_logging(debug)
    controller = None
    try:
        with signals_raise():
            cfg = build_config(argv)
            from openrlhf_hacpo.trainer.controller import HACPOController

            controller = HACPOController(cfg)
            controller.argv = argv
            _fit(controller)
    except RunInterrupted as err:
        where = (f"; the last joint checkpoint is {controller.last_checkpoint} (continue with --resume)"
                 if controller is not None and controller.last_checkpoint is not None else "")
        _report(controller, f"train_hacpo: {err}, workers stopped{where}")
        return 128 + err.signum
    except _known_errors() as err:
        if debug:
            traceback.print_exc()
        _report(controller, f"train_hacpo: error: {_one_line(err)}")
        return 2
    return 0


def _report(controller, line: str) -> None:
    """Print the run's final error on stderr and append it to ``<save_path>/train.log`` when the run logged there
    (one ``write`` of one line in append mode, so lines of other writers are never interleaved with it)."""
    print(line, file=sys.stderr)
    log = getattr(controller, "run_log", None)
    if log is None:
        return
    import time

    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{stamp} ERROR openrlhf_hacpo.cli.train_hacpo: {line}\n")
    except OSError as err:
        print(f"train_hacpo: could not append the error to {log}: {err}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
