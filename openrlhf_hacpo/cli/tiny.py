"""The embedded default: tiny heterogeneous agents learn 3-digit addition together on a CPU, in minutes.

    python -m openrlhf_hacpo.cli.tiny prepare  [--preset model]            # build the agents, export the task
    python -m openrlhf_hacpo.cli.tiny run      [--preset model] [--algorithm hacpo] [--seed 0] [-- TRAINER FLAGS]
    python -m openrlhf_hacpo.cli.tiny evaluate [--preset model | --run runs/tiny-model-hacpo-s0]

``run`` is the main job. It

1. builds the preset's agents when the zoo cache lacks them (:func:`openrlhf_hacpo.zoo.build_zoo`) and exports
   the task's train and test splits as prompt jsonl files;
2. evaluates every agent alone on the test split (greedy, :func:`openrlhf_hacpo.zoo.evaluate_accuracy`);
3. trains the agents together through the normal command line, ``python -m openrlhf_hacpo.cli.train_hacpo``
   (Ray + DeepSpeed, transformers-generate rollouts), with the preset's :class:`~openrlhf_hacpo.zoo.RLHyperparams`:
   one optimizer update per step on the learner's whole batch, no KL term (no reference model), periodic greedy
   evaluation on the test split;
4. evaluates the trained agents again, prints a before/after table, and writes ``summary.json`` and
   ``validation.png`` (each agent's greedy accuracy against step) into the run folder.

The run folder also holds what the trainer writes (``metrics.jsonl``, ``eval.jsonl``, ``hf/<agent>/``,
``checkpoints/``), ``train_command.sh`` (the exact trainer command) and ``tiny_run.json`` (the job's settings).

The summary helpers (:func:`agent_step_stats`, :func:`final_accuracy`, :func:`build_summary`,
:func:`format_table`, :func:`plot_validation`) are pure functions of the run's records; the comparison script
``benchmarks/compare_tiny.py`` reuses them.
"""
from __future__ import annotations

import argparse
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
from openrlhf_hacpo.trainer.metrics import read_jsonl

__all__ = [
    "ALGORITHMS",
    "OWNED_TRAINER_FLAGS",
    "MainJobConfig",
    "default_runs_dir",
    "default_output",
    "export_task_data",
    "trainer_argv",
    "trainer_env",
    "evaluate_folders",
    "final_accuracy",
    "agent_step_stats",
    "build_summary",
    "format_table",
    "plot_validation",
    "load_summary",
    "run_main_job",
    "main",
]

SUMMARY_FILE = "summary.json"
PLOT_FILE = "validation.png"
MARKER_FILE = "tiny_run.json"
COMMAND_FILE = "train_command.sh"
FINAL_EVALS = 2
"""The final accuracy of a run is the mean of its last this-many periodic evaluations."""

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


def default_output(preset: str, algorithm: str, seed: int) -> Path:
    return default_runs_dir() / f"tiny-{preset}-{algorithm}-s{seed}"


@dataclasses.dataclass(frozen=True)
class MainJobConfig:
    """Settings of one main job. ``None`` takes the preset's :class:`~openrlhf_hacpo.zoo.RLHyperparams` value.

    * ``preset``: a zoo preset name (``model``, ``size``, ``state``, ``three``) or a
      :class:`~openrlhf_hacpo.zoo.Preset` (custom agents, e.g. in tests).
    * ``algorithm``: a trainer algorithm preset (``hacpo``, ``gspo``, ``grpo``, ``naive``, ``hacpo-no-adv``, ...).
    * ``n_samples_per_prompt`` (G), ``steps``, ``eval_steps``: overrides of the preset's group size, number of
      steps and evaluation period.
    * ``output``: run folder (default ``<runs>/tiny-<preset>-<algorithm>-s<seed>``).
    * ``cache_dir``: zoo folder (default :func:`openrlhf_hacpo.zoo.default_cache_dir`); ``data_dir``: where the task
      jsonl files go (default: a ``tiny_data/<hash>`` folder next to the zoo folder).
    * ``build_jobs``: parallel processes for building missing agents.
    * ``extra_args``: trainer flags appended to the generated command (they override the job's values).
    * ``progress``: the trainer's progress bar.
    """

    preset: Any = "model"
    algorithm: str = "hacpo"
    n_samples_per_prompt: int | None = None
    steps: int | None = None
    seed: int = 0
    eval_steps: int | None = None
    output: Path | None = None
    cache_dir: Path | None = None
    data_dir: Path | None = None
    build_jobs: int = 2
    extra_args: tuple[str, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        from openrlhf_hacpo.zoo import Preset, get_preset

        preset = self.preset if isinstance(self.preset, Preset) else None
        if preset is None:
            if not isinstance(self.preset, str):
                raise ValueError(f"MainJobConfig.preset must be a preset name or a Preset, got {self.preset!r}")
            preset = get_preset(self.preset)
        object.__setattr__(self, "preset", preset)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"MainJobConfig.algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}")
        for name in ("n_samples_per_prompt", "steps", "eval_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"MainJobConfig.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"MainJobConfig.seed must be an int >= 0, got {self.seed!r}")
        if isinstance(self.build_jobs, bool) or not isinstance(self.build_jobs, int) or self.build_jobs < 1:
            raise ValueError(f"MainJobConfig.build_jobs must be an int >= 1, got {self.build_jobs!r}")
        extra = tuple(self.extra_args)
        if not all(isinstance(a, str) for a in extra):
            raise ValueError(f"MainJobConfig.extra_args must be strings, got {self.extra_args!r}")
        owned = sorted({a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in OWNED_TRAINER_FLAGS})
        if owned:
            raise ValueError(
                f"MainJobConfig.extra_args: {', '.join(owned)} are set by the main job; use its own options "
                "(--preset, --algorithm, --n_samples_per_prompt, --steps, --seed, --eval_steps, --output)")
        object.__setattr__(self, "extra_args", extra)
        for name in ("output", "cache_dir", "data_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value).expanduser())
        if self.output is None:
            object.__setattr__(self, "output", default_output(preset.name, self.algorithm, self.seed))

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
        from openrlhf_hacpo.algorithms import HACPOConfig

        return HACPOConfig.preset(self.algorithm).trains_on_foreign

    @property
    def rows_per_learner(self) -> int:
        """Rows in one learner's batch per step: its own rollouts, or every agent's for hacpo / naive."""
        sources = len(self.preset.agents) if self.trains_on_foreign else 1
        return sources * self.preset.rl.prompts_per_step * self.group_size


# ---------------------------------------------------------------------------------------------------------- data
def _task_config(rl) -> Any:
    from openrlhf_hacpo.data import TaskConfig

    base = TaskConfig()
    changes = {}
    if tuple(rl.prompt_levels) != base.train_levels:
        changes["train_levels"] = tuple(rl.prompt_levels)
    if rl.eval_size > getattr(base, f"{rl.eval_split}_size"):
        changes[f"{rl.eval_split}_size"] = rl.eval_size
    return dataclasses.replace(base, **changes) if changes else base


def _default_data_dir(task, cache_dir: Path | None) -> Path:
    from openrlhf_hacpo.zoo import default_cache_dir

    digest = hashlib.sha256(json.dumps(dataclasses.asdict(task), sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()).parent / "tiny_data" / digest


def export_task_data(rl, data_dir: Path | None = None, cache_dir: Path | None = None) -> dict[str, Path]:
    """Write the RL prompts (``train.jsonl``) and the evaluation prompts (``eval.jsonl``: the first
    ``rl.eval_size`` problems of ``rl.eval_split``) in the trainer's prompt format; returns both paths.

    Files that already hold exactly the same rows are left alone, so concurrent runs can share the folder."""
    from openrlhf_hacpo.data import export_jsonl, make_splits

    task = _task_config(rl)
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
    rows = cfg.rows_per_learner
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
        # one optimizer update per step on the learner's whole batch, as for every arm of the comparison
        "--train_batch_size", str(rows), "--micro_train_batch_size", str(math.gcd(rows, 64)),
        "--actor_learning_rate", str(rl.lr), "--lr_scheduler", "constant_with_warmup",
        "--lr_warmup_steps", str(rl.warmup_steps), "--adam_betas", str(rl.adam_betas[0]), str(rl.adam_betas[1]),
        "--l2", "0", "--max_norm", str(rl.grad_clip),
        "--max_steps", str(cfg.num_steps), "--seed", str(cfg.seed),
        "--eval_data", str(data["eval"]), "--eval_steps", str(cfg.eval_period),
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
def evaluate_folders(folders: Mapping[str, Path], problems: Sequence[Any], max_new_tokens: int = 40
                     ) -> dict[str, float]:
    """Greedy accuracy of each Hugging Face model folder on ``problems`` (every agent alone)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openrlhf_hacpo.zoo import evaluate_accuracy

    out = {}
    for name, folder in folders.items():
        if not (Path(folder) / "config.json").is_file():
            raise FileNotFoundError(f"agent {name!r}: no model under {folder}")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        out[name] = evaluate_accuracy(model, tokenizer, problems, max_new_tokens=max_new_tokens).accuracy
    return out


# ---------------------------------------------------------------------------------------------------------- summary
def final_accuracy(curve: Sequence[tuple[int, float]], last: int = FINAL_EVALS) -> float:
    """Mean accuracy of the last ``last`` evaluations of a ``[(step, accuracy), ...]`` curve (sorted by step)."""
    if not curve:
        raise ValueError("final_accuracy needs at least one evaluation")
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    tail = sorted(curve, key=lambda p: p[0])[-last:]
    return sum(a for _, a in tail) / len(tail)


_PHASES = {"generate": "time/generate", "logprob": "time/logprob", "update": "time/update",
           "reward": "time/reward", "sync": "time/sync", "step": "time/step"}
_FOREIGN = {"in_window_frac": "policy/foreign_in_window_frac", "ratio_mean": "policy/foreign_ratio_mean",
            "below_window_frac": "policy/foreign_clip_frac_lower", "above_window_frac": "policy/foreign_clip_frac_upper",
            "ratio_median": "policy/foreign_ratio_median", "pos_in_window_frac": "policy/foreign_pos_in_window_frac",
            "pos_below_window_frac": "policy/foreign_pos_clip_frac_lower",
            "pos_above_window_frac": "policy/foreign_pos_clip_frac_upper"}


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def agent_step_stats(records: Sequence[Mapping[str, Any]], rollouts_per_step: int) -> dict[str, Any]:
    """Totals and per-step means of one agent's ``metrics.jsonl`` records.

    * ``steps``; ``rollouts_generated`` (own rollouts: ``view/num_own_rows`` summed, else
      ``rollouts_per_step`` per step); ``rows_trained`` (own + foreign rows, ``view/num_rows``);
    * ``generated_tokens`` (``response/tokens_mean`` × own rollouts) and ``tokens_per_s`` (generated tokens over
      generation seconds);
    * ``seconds``: mean seconds per step of each phase (generate, logprob, update, reward, sync, step) and
      ``samples_trained_per_s`` (rows trained over update seconds);
    * ``foreign``: per-step means of the foreign-ratio statistics (fraction of foreign rollouts in the clip
      window, below and above it, mean ratio; the median and the fractions among rows with A > 0 when the
      trainer logs them), or ``None`` when the agent
      trained on no foreign rollouts.
    """
    if not records:
        raise ValueError("agent_step_stats needs at least one step record")
    own = [float(r.get("view/num_own_rows", rollouts_per_step)) for r in records]
    rows = [float(r.get("view/num_rows", o)) for r, o in zip(records, own)]
    tokens = sum(float(r.get("response/tokens_mean", 0.0)) * o for r, o in zip(records, own))
    gen_s = sum(float(r.get("time/generate", 0.0)) for r in records)
    upd_s = sum(float(r.get("time/update", 0.0)) for r in records)
    seconds = {name: _mean([r.get(key) for r in records]) for name, key in _PHASES.items()}
    foreign = None
    if any(_FOREIGN["in_window_frac"] in r for r in records):
        foreign = {name: _mean([r.get(key) for r in records]) for name, key in _FOREIGN.items()}
    return {
        "steps": len(records),
        "rollouts_generated": int(round(sum(own))),
        "rows_trained": int(round(sum(rows))),
        "generated_tokens": int(round(tokens)),
        "tokens_per_s": tokens / gen_s if gen_s > 0 else None,
        "samples_trained_per_s": sum(rows) / upd_s if upd_s > 0 else None,
        "seconds": seconds,
        "foreign": foreign,
        "train_reward_last10": _mean([r.get("reward/mean") for r in records[-10:]]),
    }


def build_summary(
    *,
    run: Mapping[str, Any],
    acc_before: Mapping[str, float],
    acc_after: Mapping[str, float],
    step_records: Sequence[Mapping[str, Any]],
    eval_records: Sequence[Mapping[str, Any]],
    rollouts_per_step: int,
) -> dict[str, Any]:
    """``summary.json`` of a run from its before/after accuracies and the trainer's metrics / eval records.

    ``run`` carries the run-wide facts (preset, algorithm, seed, wall seconds, ...); ``rollouts_total`` is added.
    Per agent: ``acc_before``, ``acc_after``, ``acc_final`` (mean of the last two periodic evaluations),
    ``validation`` (``[[step, accuracy], ...]`` starting with step 0 = ``acc_before``) and
    :func:`agent_step_stats`.
    """
    agents: dict[str, Any] = {}
    for name in acc_before:
        mine = [r for r in step_records if r.get("agent") == name]
        curve = sorted((int(r["step"]), float(r["accuracy"])) for r in eval_records if r.get("agent") == name)
        entry: dict[str, Any] = {
            "acc_before": float(acc_before[name]),
            "acc_after": float(acc_after[name]),
            "acc_final": final_accuracy(curve) if curve else float(acc_after[name]),
            "validation": [[0, float(acc_before[name])]] + [[s, a] for s, a in curve if s > 0],
        }
        if mine:
            entry.update(agent_step_stats(mine, rollouts_per_step))
        else:
            entry.update(steps=0, rollouts_generated=0, rows_trained=0)
        agents[name] = entry
    out_run = dict(run)
    out_run["rollouts_total"] = sum(a["rollouts_generated"] for a in agents.values())
    return {"run": out_run, "agents": agents}


def format_table(summary: Mapping[str, Any]) -> str:
    """Before/after table of a summary, one row per agent (markdown)."""
    run = summary["run"]
    lines = [
        f"preset {run.get('preset')} · {run.get('algorithm')} · seed {run.get('seed')} · "
        f"{run.get('steps')} steps · G={run.get('n_samples_per_prompt')}",
        "",
        "| agent | test acc. before | test acc. after | change | final (mean of last 2 evals) | rollouts generated |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in summary["agents"].items():
        lines.append(f"| {name} | {a['acc_before']:.3f} | {a['acc_after']:.3f} | "
                     f"{a['acc_after'] - a['acc_before']:+.3f} | {a['acc_final']:.3f} | {a['rollouts_generated']:,} |")
    return "\n".join(lines)


def plot_validation(summary: Mapping[str, Any], path: Path) -> Path:
    """PNG of each agent's greedy accuracy on the evaluation prompts against the training step (atomic write)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from openrlhf_hacpo.utils.atomic import atomic_write_bytes

    run = summary["run"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, a in summary["agents"].items():
        steps = [s for s, _ in a["validation"]]
        accs = [v for _, v in a["validation"]]
        ax.plot(steps, accs, marker="o", markersize=3, label=f"{name} ({a['acc_before']:.2f} → {a['acc_after']:.2f})")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"greedy accuracy ({run.get('eval_problems', '')} {run.get('eval_split', 'test')} problems)")
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.set_title(f"{run.get('algorithm')} · preset {run.get('preset')} · seed {run.get('seed')}")
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def load_summary(run_dir: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of a run folder, or ``None`` when the run has not finished."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------------------- main job
def _prepare_output(output: Path) -> None:
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


def run_main_job(cfg: MainJobConfig) -> dict[str, Any]:
    """Build, evaluate, train (through the ``train_hacpo`` command), evaluate again; returns the summary."""
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.utils.atomic import atomic_write_json, atomic_write_text
    from openrlhf_hacpo.zoo import build_zoo

    start = time.perf_counter()
    preset, rl = cfg.preset, cfg.preset.rl
    output = cfg.output.resolve()
    _prepare_output(output)
    settings = {"preset": preset.name, "algorithm": cfg.algorithm, "seed": cfg.seed, "steps": cfg.num_steps,
                "n_samples_per_prompt": cfg.group_size, "eval_steps": cfg.eval_period,
                "extra_args": list(cfg.extra_args), "agents": list(preset.agent_names)}
    atomic_write_json(output / MARKER_FILE, settings)

    _log(f"preset {preset.name!r} ({preset.description}); agents {', '.join(preset.agent_names)}", start)
    paths = build_zoo(preset.agents, cfg.cache_dir, progress=True, jobs=cfg.build_jobs)
    data = export_task_data(rl, cfg.data_dir, cfg.cache_dir)
    problems = make_splits(_task_config(rl))[rl.eval_split][: rl.eval_size]
    _log(f"agents ready; task data in {data['train'].parent}", start)

    _log(f"evaluating each agent alone on {len(problems)} {rl.eval_split} problems (greedy)", start)
    before = evaluate_folders(paths, problems, rl.max_new_tokens)
    for name, acc in before.items():
        _log(f"  {name}: {acc:.3f}", start)

    argv = trainer_argv(cfg, paths, data)
    command = [sys.executable, "-m", "openrlhf_hacpo.cli.train_hacpo", *argv]
    atomic_write_text(output / COMMAND_FILE, "#!/usr/bin/env bash\n" + shlex.join(command) + "\n")
    _log(f"training with {cfg.algorithm} for {cfg.num_steps} steps ({rl.prompts_per_step} prompts x "
         f"G={cfg.group_size} per agent and step); trainer command in {output / COMMAND_FILE}", start)
    t_train = time.perf_counter()
    status = subprocess.run(command, env=trainer_env()).returncode
    train_s = time.perf_counter() - t_train
    if status != 0:
        raise RuntimeError(f"the trainer exited with status {status} (its output is above); the command is in "
                           f"{output / COMMAND_FILE}")

    _log("evaluating the trained agents", start)
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
        "command": command,
        "omp_num_threads": trainer_env().get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
    }
    summary = build_summary(run=run, acc_before=before, acc_after=after,
                            step_records=read_jsonl(output / "metrics.jsonl"),
                            eval_records=read_jsonl(output / "eval.jsonl"),
                            rollouts_per_step=rl.prompts_per_step * cfg.group_size)
    plot_validation(summary, output / PLOT_FILE)
    summary["run"]["wall_seconds"] = time.perf_counter() - start
    atomic_write_json(output / SUMMARY_FILE, summary)
    print()
    print(format_table(summary))
    print()
    print(f"wall time {summary['run']['wall_seconds']:.0f} s ({summary['run']['wall_seconds'] / 60:.1f} min), "
          f"training {train_s:.0f} s; {summary['run']['rollouts_total']:,} rollouts; "
          f"summary {output / SUMMARY_FILE}, plot {output / PLOT_FILE}")
    return summary


# ---------------------------------------------------------------------------------------------------------- commands
def _cmd_prepare(args: argparse.Namespace) -> int:
    from openrlhf_hacpo.zoo import build_zoo, get_preset

    preset = get_preset(args.preset)
    paths = build_zoo(preset.agents, args.cache_dir, progress=True, jobs=args.jobs)
    data = export_task_data(preset.rl, args.data_dir, args.cache_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    for name, path in data.items():
        print(f"{name} prompts: {path}")
    return 0


def _cmd_run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    cfg = MainJobConfig(preset=args.preset, algorithm=args.algorithm, n_samples_per_prompt=args.n_samples_per_prompt,
                        steps=args.steps, seed=args.seed, eval_steps=args.eval_steps, output=args.output,
                        cache_dir=args.cache_dir, data_dir=args.data_dir, build_jobs=args.jobs,
                        extra_args=tuple(extra), progress=not args.no_progress_bar)
    run_main_job(cfg)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.zoo import build_zoo, get_preset

    preset = get_preset(args.preset)
    rl = preset.rl
    if args.run is not None:
        hf = Path(args.run) / "hf"
        if not hf.is_dir():
            raise FileNotFoundError(f"--run {args.run}: no hf/ folder (has the run finished?)")
        folders = {p.name: p for p in sorted(hf.iterdir()) if p.is_dir()}
    else:
        folders = build_zoo(preset.agents, args.cache_dir, progress=True, jobs=args.jobs)
    problems = make_splits(_task_config(rl))[args.split]
    if args.max_problems is not None:
        problems = problems[: args.max_problems]
    t0 = time.perf_counter()
    accs = evaluate_folders(folders, problems, rl.max_new_tokens)
    print(f"| agent | greedy accuracy ({len(problems)} {args.split} problems) |")
    print("|---|---|")
    for name, acc in accs.items():
        print(f"| {name} | {acc:.3f} |")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from openrlhf_hacpo.zoo import DEFAULT_PRESET, PRESETS

    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_hacpo.cli.tiny",
        description="Tiny heterogeneous agents that learn 3-digit addition together on a CPU.",
        epilog="Trainer flags after '--' are passed to train_hacpo, e.g. `run -- --micro_train_batch_size 32`.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS),
                        help="agents: model (llamaS + qwenM), size, state, three")
    common.add_argument("--cache_dir", "--cache-dir", type=Path, default=None,
                        help="zoo folder (default: $HACPO_CACHE_DIR/zoo or <repo>/.cache/zoo)")
    common.add_argument("--jobs", type=int, default=2, help="parallel processes for building missing agents")

    p = sub.add_parser("prepare", parents=[common], help="build the preset's agents and export the task jsonl")
    p.add_argument("--data_dir", "--data-dir", type=Path, default=None, help="where train/eval jsonl go")

    p = sub.add_parser("run", parents=[common], help="the main job: evaluate, train together, evaluate again")
    p.add_argument("--algorithm", default="hacpo", choices=ALGORITHMS,
                   help="hacpo; gspo / grpo (each agent alone); naive (shared rollouts, plain advantages); "
                   "or a HACPO ablation")
    p.add_argument("--n_samples_per_prompt", type=int, default=None, help="G per agent [preset: 8]")
    p.add_argument("--steps", type=int, default=None, help="training steps [preset: 80]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval_steps", type=int, default=None, help="evaluate every N steps [preset: 10]")
    p.add_argument("--output", type=Path, default=None,
                   help="run folder [<repo>/runs/tiny-<preset>-<algorithm>-s<seed>]")
    p.add_argument("--data_dir", "--data-dir", type=Path, default=None, help="where train/eval jsonl go")
    p.add_argument("--no_progress_bar", action="store_true")

    p = sub.add_parser("evaluate", parents=[common], help="greedy accuracy of the zoo agents or of a run's agents")
    p.add_argument("--run", type=Path, default=None, help="a run folder (evaluates its hf/<agent> models)")
    p.add_argument("--split", default="test", choices=("validation", "test"))
    p.add_argument("--max_problems", type=int, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    if extra and args.command != "run":
        print(f"tiny {args.command}: error: trainer flags after '--' only apply to `run`", file=sys.stderr)
        return 2
    try:
        if args.command == "prepare":
            return _cmd_prepare(args)
        if args.command == "run":
            return _cmd_run(args, extra)
        return _cmd_evaluate(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"tiny {args.command}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"tiny {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
