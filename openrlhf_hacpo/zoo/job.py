"""The tiny main job: from a zoo preset to a trained run folder.

:func:`run_main_job`

1. takes the preset's shipped agents (:func:`openrlhf_hacpo.zoo.shipped.agent_folders`, their files checked
   against their manifests; with ``rebuild`` agents built on this machine instead) and exports the task's train and
   test splits as prompt jsonl files (:func:`export_task_data`);
2. trains the agents together through the normal command line, ``python -m openrlhf_hacpo.cli.train_hacpo``
   (Ray + DeepSpeed, transformers-generate rollouts; flags from :func:`trainer_argv`), with the preset's
   :class:`~openrlhf_hacpo.zoo.RLHyperparams`: one optimizer update per step on the learner's whole batch, no KL
   term (no reference model), greedy evaluation of every agent alone on the test split before training, every
   ``eval_steps`` steps and after the last step (the agents evaluate in their own worker processes, side by side;
   greedy decoding draws no random numbers, so the evaluations do not change the training);
3. takes each agent's accuracy before and after training from those evaluations (``eval.jsonl``; evaluates the
   folders itself, :func:`evaluate_folders`, only when an evaluation is missing), prints the before/after table
   beside the README's seed spread for the same preset, arm and agents (:mod:`openrlhf_hacpo.zoo.reference`), and
   writes ``summary.json`` (with the agents' fingerprints, that comparison and the seconds of each phase) and
   ``validation.png`` (:mod:`openrlhf_hacpo.zoo.reports`) into the run folder.

The run folder also holds what the trainer writes (``metrics.jsonl``, ``eval.jsonl``, ``hf/<agent>/``,
``checkpoints/``), ``train_command.sh`` (the exact trainer command) and ``tiny_run.json`` (the job's settings).
The trainer runs as a subprocess, so this module imports nothing from the trainer or the actors.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from openrlhf_hacpo.algorithms import PRESETS as ALGORITHMS
from openrlhf_hacpo.algorithms import HACPOConfig
from openrlhf_hacpo.data import Problem, TaskConfig, export_jsonl, make_splits
from openrlhf_hacpo.engines.node_plan import PLACEMENT_FILE
from openrlhf_hacpo.utils.atomic import atomic_write_json, atomic_write_text
from openrlhf_hacpo.zoo.cache import default_cache_dir
from openrlhf_hacpo.zoo.evaluate import evaluate_accuracy
from openrlhf_hacpo.zoo.presets import DEFAULT_REGIME, REGIMES, Preset, RLHyperparams, get_preset, get_regime
from openrlhf_hacpo.zoo.reference import compare_with_reference, load_reference, reference_path
from openrlhf_hacpo.zoo.shipped import agent_folders, agent_records
from openrlhf_hacpo.zoo.reports import (
    PLOT_FILE,
    SUMMARY_FILE,
    build_summary,
    format_table,
    plot_validation,
    read_records,
)

__all__ = [
    "ALGORITHMS",
    "COMMAND_FILE",
    "MARKER_FILE",
    "OWNED_TRAINER_FLAGS",
    "MainJobConfig",
    "default_output",
    "default_runs_dir",
    "accuracies_at",
    "evaluate_folders",
    "export_task_data",
    "prepare_output",
    "run_main_job",
    "task_config",
    "trainer_argv",
    "trainer_env",
]

MARKER_FILE = "tiny_run.json"
COMMAND_FILE = "train_command.sh"

OWNED_TRAINER_FLAGS = (
    "--agent", "--agents_config", "--prompt_data", "--eval_data", "--save_path", "--algorithm",
    "--n_samples_per_prompt", "--max_steps", "--seed", "--eval_steps",
)
"""Trainer flags the main job sets from its own options; passing them after ``--`` is an error."""


def _log(message: str, start: float | None = None) -> None:
    stamp = f"[tiny {time.perf_counter() - start:6.1f}s]" if start is not None else "[tiny]"
    print(f"{stamp} {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------- config
def _repo_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "setup.py").is_file() and (root / "openrlhf_hacpo").is_dir() else None


def default_runs_dir() -> Path:
    """``$HACPO_RUNS_DIR``, else ``<repo>/runs`` (git-ignored) in a source checkout, else ``./runs``."""
    env = os.environ.get("HACPO_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    root = _repo_root()
    return root / "runs" if root is not None else Path("runs")


def default_output(preset: str, algorithm: str, seed: int, regime: str = DEFAULT_REGIME) -> Path:
    suffix = "" if regime == DEFAULT_REGIME else f"-{regime}"
    return default_runs_dir() / f"tiny-{preset}-{algorithm}-s{seed}{suffix}"


def source_commit() -> dict[str, Any]:
    """The commit of the code that runs (``git rev-parse HEAD`` of the source checkout) and whether tracked files
    differ from it (``dirty``); ``{"commit": None}`` outside a git checkout. Reports refuse to put runs of different
    commits into one table (``benchmarks/compare_tiny.py``)."""
    root = _repo_root()
    if root is None or not (root / ".git").exists():
        return {"commit": None, "dirty": None}
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(status.strip())}


@dataclasses.dataclass(frozen=True)
class MainJobConfig:
    """Settings of one main job. ``None`` takes the preset's :class:`~openrlhf_hacpo.zoo.RLHyperparams` value.

    * ``preset``: a zoo preset name (``model``, ``size``, ``state``, ``three``) or a
      :class:`~openrlhf_hacpo.zoo.Preset` (custom agents, e.g. in tests).
    * ``algorithm``: a trainer algorithm preset (``hacpo``, ``gspo``, ``grpo``, ``naive-paper``, ``naive-gated``,
      ``hacpo-no-adv``, ...).
    * ``regime``: how each step splits into optimizer updates, and the learning rate (:data:`~openrlhf_hacpo.zoo.
      presets.REGIMES`: ``single-update``, the default, or ``paper``).
    * ``n_samples_per_prompt`` (G), ``steps``, ``eval_steps``: overrides of the preset's group size, number of
      steps and evaluation period.
    * ``output``: run folder (default ``<runs>/tiny-<preset>-<algorithm>-s<seed>``, ``-<regime>`` appended for a
      regime other than the default).
    * ``cache_dir``: zoo folder (default :func:`openrlhf_hacpo.zoo.default_cache_dir`); ``data_dir``: where the task
      jsonl files go (default: a ``tiny_data/<hash>`` folder next to the zoo folder).
    * ``rebuild``: train agents built on this machine from their recipes (built into ``cache_dir`` on first use)
      instead of the shipped ones; results then name them by their own fingerprints.
    * ``build_jobs``: parallel processes for building agents (with ``rebuild``, or for custom agent specs).
    * ``results_dir``: where the README's ``tiny_<preset>.json`` is looked up (default ``<repo>/benchmarks/results``).
    * ``extra_args``: trainer flags appended to the generated command (they override the job's values).
    * ``progress``: the trainer's progress bar.
    """

    preset: str | Preset = "model"
    algorithm: str = "hacpo"
    regime: str = DEFAULT_REGIME
    n_samples_per_prompt: int | None = None
    steps: int | None = None
    seed: int = 0
    eval_steps: int | None = None
    output: Path | None = None
    cache_dir: Path | None = None
    data_dir: Path | None = None
    rebuild: bool = False
    build_jobs: int = 2
    extra_args: tuple[str, ...] = ()
    progress: bool = True
    results_dir: Path | None = None

    def __post_init__(self) -> None:
        preset = self.preset if isinstance(self.preset, Preset) else None
        if preset is None:
            if not isinstance(self.preset, str):
                raise ValueError(f"MainJobConfig.preset must be a preset name or a Preset, got {self.preset!r}")
            preset = get_preset(self.preset)
        object.__setattr__(self, "preset", preset)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"MainJobConfig.algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}")
        if self.regime not in REGIMES:
            raise ValueError(f"MainJobConfig.regime must be one of {sorted(REGIMES)}, got {self.regime!r}")
        for name in ("n_samples_per_prompt", "steps", "eval_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"MainJobConfig.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"MainJobConfig.seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.rebuild, bool):
            raise ValueError(f"MainJobConfig.rebuild must be True or False, got {self.rebuild!r}")
        if isinstance(self.build_jobs, bool) or not isinstance(self.build_jobs, int) or self.build_jobs < 1:
            raise ValueError(f"MainJobConfig.build_jobs must be an int >= 1, got {self.build_jobs!r}")
        extra = tuple(self.extra_args)
        if not all(isinstance(a, str) for a in extra):
            raise ValueError(f"MainJobConfig.extra_args must be strings, got {self.extra_args!r}")
        owned = sorted({a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in OWNED_TRAINER_FLAGS})
        if owned:
            raise ValueError(
                f"MainJobConfig.extra_args: {', '.join(owned)} are set by the main job; use its own options "
                "(--preset, --algorithm, --regime, --n_samples_per_prompt, --steps, --seed, --eval_steps, --output)")
        object.__setattr__(self, "extra_args", extra)
        for name in ("output", "cache_dir", "data_dir", "results_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value).expanduser())
        if self.output is None:
            object.__setattr__(self, "output", default_output(preset.name, self.algorithm, self.seed, self.regime))

    @property
    def group_size(self) -> int:
        return self.n_samples_per_prompt or self.preset.rl.group_size

    @property
    def num_steps(self) -> int:
        return self.steps or self.preset.rl.num_steps

    @property
    def eval_period(self) -> int:
        return self.eval_steps or self.preset.rl.eval_every

    @property
    def trains_on_foreign(self) -> bool:
        return HACPOConfig.preset(self.algorithm).trains_on_foreign

    @property
    def rows_per_learner(self) -> int:
        """Rows in one learner's batch per step: its own rollouts, or every agent's for hacpo / naive."""
        sources = len(self.preset.agents) if self.trains_on_foreign else 1
        return sources * self.preset.rl.prompts_per_step * self.group_size

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per learner and step under the job's regime."""
        return get_regime(self.regime).updates_per_step(self.rows_per_learner)


# ---------------------------------------------------------------------------------------------------------- data
def task_config(rl: RLHyperparams) -> TaskConfig:
    """The arithmetic task of a preset's RL settings: the default task with ``rl.prompt_levels`` as training levels
    and an evaluation split of at least ``rl.eval_size`` problems."""
    base = TaskConfig()
    changes = {}
    if tuple(rl.prompt_levels) != base.train_levels:
        changes["train_levels"] = tuple(rl.prompt_levels)
    if rl.eval_size > getattr(base, f"{rl.eval_split}_size"):
        changes[f"{rl.eval_split}_size"] = rl.eval_size
    return dataclasses.replace(base, **changes) if changes else base


def _default_data_dir(task: TaskConfig, cache_dir: Path | None) -> Path:
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(task), sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()).parent / "tiny_data" / digest


def export_task_data(rl: RLHyperparams, data_dir: Path | None = None, cache_dir: Path | None = None) -> dict[str, Path]:
    """Write the RL prompts (``train.jsonl``) and the evaluation prompts (``eval.jsonl``: the first
    ``rl.eval_size`` problems of ``rl.eval_split``) in the trainer's prompt format; returns both paths.

    Files that already hold exactly the same rows are left alone, so concurrent runs can share the folder."""
    task = task_config(rl)
    folder = Path(data_dir) if data_dir is not None else _default_data_dir(task, cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    splits = make_splits(task)
    wanted = {"train": ("train", None), "eval": (rl.eval_split, rl.eval_size)}
    out = {}
    for name, (split, size) in wanted.items():
        path = folder / f"{name}.jsonl"
        problems = splits[split] if size is None else splits[split][:size]
        expected = len(problems)
        if not (path.is_file() and sum(1 for _ in open(path, encoding="utf-8")) == expected):
            export_jsonl(split if size is None else list(problems), path, "chat", task)
        out[name] = path
    return out


# ---------------------------------------------------------------------------------------------------------- trainer
def trainer_argv(cfg: MainJobConfig, agent_paths: Mapping[str, Path], data: Mapping[str, Path]) -> list[str]:
    """The ``train_hacpo`` command-line flags of the main job (``cfg.extra_args`` last, so they win)."""
    rl = cfg.preset.rl
    regime = get_regime(cfg.regime)
    rows = regime.rows_per_mini_batch(cfg.rows_per_learner)
    argv: list[str] = []
    for name, path in agent_paths.items():
        argv += ["--agent", f"name={name},pretrain={path}"]
    argv += [
        "--prompt_data", str(data["train"]), "--input_key", "input", "--label_key", "label",
        "--apply_chat_template",
        "--prompt_max_len", "64", "--generate_max_len", str(rl.max_new_tokens),
        "--rollout_backend", "hf",
        "--n_samples_per_prompt", str(cfg.group_size), "--rollout_batch_size", str(rl.prompts_per_step),
        "--temperature", str(rl.temperature), "--top_p", "1.0", "--top_k", "-1",
        "--reward_fn", "arithmetic", "--reward_num_workers", "0",
        "--algorithm", cfg.algorithm, "--init_kl_coef", "0",
        # the regime's mini-batch (single-update: the learner's whole batch, one optimizer update per step);
        # the warm-up counts optimizer updates, so warmup_steps steps are warmup_steps x updates per step
        "--train_batch_size", str(rows), "--micro_train_batch_size", str(math.gcd(rows, 64)),
        "--actor_learning_rate", str(regime.learning_rate(rl)), "--lr_scheduler", "constant_with_warmup",
        "--lr_warmup_steps", str(rl.warmup_steps * cfg.updates_per_step),
        "--adam_betas", str(rl.adam_betas[0]), str(rl.adam_betas[1]),
        "--l2", "0", "--max_norm", str(rl.grad_clip),
        "--max_steps", str(cfg.num_steps), "--seed", str(cfg.seed),
        "--eval_data", str(data["eval"]), "--eval_steps", str(cfg.eval_period), "--eval_before_training",
        "--save_path", str(cfg.output), "--save_steps", "-1", "--max_ckpt_num", "1", "--logging_steps", "1",
    ]
    if not cfg.progress:
        argv.append("--no_progress_bar")
    return argv + list(cfg.extra_args)


def trainer_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of the trainer process: one thread per worker, offline Hugging Face, quiet loading bars."""
    env = dict(os.environ if base is None else base)
    for key, value in (("OMP_NUM_THREADS", "1"), ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1"),
                       ("TRANSFORMERS_OFFLINE", "1"), ("RAY_USAGE_STATS_ENABLED", "0"),
                       ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        env.setdefault(key, value)
    return env


# ---------------------------------------------------------------------------------------------------------- evaluation
def evaluate_folders(folders: Mapping[str, Path], problems: Sequence[Problem], max_new_tokens: int = 40
                     ) -> dict[str, float]:
    """Greedy accuracy of each Hugging Face model folder on ``problems`` (every agent alone)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for name, folder in folders.items():
        if not (Path(folder) / "config.json").is_file():
            raise FileNotFoundError(f"agent {name!r}: no model under {folder}")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        out[name] = evaluate_accuracy(model, tokenizer, problems, max_new_tokens=max_new_tokens).accuracy
    return out


# ---------------------------------------------------------------------------------------------------------- main job
def prepare_output(output: Path) -> None:
    """A fresh run folder: a folder of an earlier main job is cleared, any other non-empty folder is refused."""
    if output.exists():
        if not output.is_dir():
            raise ValueError(f"--output {output} exists and is not a folder")
        if any(output.iterdir()):
            if not (output / MARKER_FILE).is_file():
                raise ValueError(f"--output {output} is a non-empty folder that no tiny run wrote; choose another")
            for child in output.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    output.mkdir(parents=True, exist_ok=True)


def _versions() -> dict[str, str]:
    import importlib

    out = {}
    for name in ("torch", "transformers", "deepspeed", "ray"):
        try:
            out[name] = importlib.import_module(name).__version__
        except ImportError:
            out[name] = "missing"
    return out


def accuracies_at(eval_records: Sequence[Mapping[str, Any]], names: Sequence[str], step: int | None
                  ) -> dict[str, float] | None:
    """``{agent: greedy accuracy}`` of the trainer's evaluation at ``step`` (``None``: each agent's last one), or
    ``None`` when an agent has no such evaluation."""
    out = {}
    for name in names:
        mine = [r for r in eval_records if r.get("agent") == name and (step is None or int(r["step"]) == step)]
        if not mine:
            return None
        out[name] = float(max(mine, key=lambda r: int(r["step"]))["accuracy"])
    return out


def run_main_job(cfg: MainJobConfig, started: float | None = None) -> dict[str, Any]:
    """Take the agents, train them (through the ``train_hacpo`` command, which also evaluates them before and
    after), report; returns the summary. ``started``: the ``time.perf_counter()`` the clock of the progress
    messages and of ``wall_seconds`` starts from (the command line passes its own start; default now)."""
    start = time.perf_counter() if started is None else started
    preset, rl = cfg.preset, cfg.preset.rl
    output = cfg.output.resolve()
    prepare_output(output)
    settings = {"preset": preset.name, "algorithm": cfg.algorithm, "regime": cfg.regime, "seed": cfg.seed,
                "steps": cfg.num_steps, "updates_per_step": cfg.updates_per_step, **source_commit(),
                "n_samples_per_prompt": cfg.group_size, "eval_steps": cfg.eval_period,
                "extra_args": list(cfg.extra_args), "agents": list(preset.agent_names), "rebuild": cfg.rebuild}
    atomic_write_json(output / MARKER_FILE, settings)

    _log(f"preset {preset.name!r} ({preset.description}); agents {', '.join(preset.agent_names)}", start)
    paths = agent_folders(preset.agents, cfg.cache_dir, rebuild=cfg.rebuild, progress=True, jobs=cfg.build_jobs)
    used = agent_records(paths)
    data = export_task_data(rl, cfg.data_dir, cfg.cache_dir)
    problems = make_splits(task_config(rl))[rl.eval_split][: rl.eval_size]
    _log(f"agents ready; task data in {data['train'].parent}", start)

    argv = trainer_argv(cfg, paths, data)
    command = [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo", *argv]
    atomic_write_text(output / COMMAND_FILE, "#!/usr/bin/env bash\n" + shlex.join(command) + "\n")
    _log(f"training with {cfg.algorithm} for {cfg.num_steps} steps ({rl.prompts_per_step} prompts x "
         f"G={cfg.group_size} per agent and step), evaluating each agent alone on {len(problems)} "
         f"{rl.eval_split} problems (greedy) before, every {cfg.eval_period} steps and after; trainer command in "
         f"{output / COMMAND_FILE}", start)
    t_train = time.perf_counter()
    setup_s = t_train - start
    status = subprocess.run(command, env=trainer_env()).returncode
    train_s = time.perf_counter() - t_train
    if status != 0:
        raise RuntimeError(f"the trainer exited with status {status} (its output is above); the command is in "
                           f"{output / COMMAND_FILE}")

    t_report = time.perf_counter()
    evals = read_records(output / "eval.jsonl") if (output / "eval.jsonl").is_file() else []
    before = accuracies_at(evals, list(paths), 0)
    if before is None:
        _log("the trainer logged no evaluation before training; evaluating the agents", start)
        before = evaluate_folders(paths, problems, rl.max_new_tokens)
    after = accuracies_at([r for r in evals if int(r["step"]) > 0], list(paths), None)
    if after is None:
        _log("the trainer logged no evaluation after training; evaluating the trained agents", start)
        after = evaluate_folders({name: output / "hf" / name for name in paths}, problems, rl.max_new_tokens)
    run = {
        **settings,
        "heterogeneity": preset.heterogeneity,
        "prompts_per_step": rl.prompts_per_step,
        "eval_split": rl.eval_split,
        "eval_problems": len(problems),
        "wall_seconds": time.perf_counter() - start,
        "train_seconds": train_s,
        "agent_paths": {name: str(p) for name, p in paths.items()},
        "agents_used": used,
        "command": command,
        "omp_num_threads": trainer_env().get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
    }
    summary = build_summary(run=run, acc_before=before, acc_after=after,
                            step_records=read_records(output / "metrics.jsonl"), eval_records=evals,
                            rollouts_per_step=rl.prompts_per_step * cfg.group_size)
    if (output / PLACEMENT_FILE).is_file():  # where the trainer's workers landed (per agent, role and rank)
        summary["placement"] = json.loads((output / PLACEMENT_FILE).read_text())
    ref_path = reference_path(preset.name, cfg.num_steps, rl.num_steps, cfg.results_dir, cfg.regime)
    reference, reason = load_reference(ref_path)
    summary["reference"] = compare_with_reference(summary, reference, reason,
                                                  source=ref_path.name if ref_path is not None else None)
    plot_validation(summary, output / PLOT_FILE)
    summary["run"]["wall_seconds"] = time.perf_counter() - start
    summary["run"]["phase_seconds"] = {"setup": setup_s, "train": train_s, "report": time.perf_counter() - t_report}
    atomic_write_json(output / SUMMARY_FILE, summary)
    print()
    print(format_table(summary, summary["reference"]))
    print()
    print(f"wall time {summary['run']['wall_seconds']:.0f} s ({summary['run']['wall_seconds'] / 60:.1f} min), "
          f"training {train_s:.0f} s; {summary['run']['rollouts_total']:,} rollouts; "
          f"summary {output / SUMMARY_FILE}, plot {output / PLOT_FILE}")
    return summary
