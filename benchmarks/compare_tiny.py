"""HACPO against its baselines and ablations on the tiny agents, measured through the main job.

    python benchmarks/compare_tiny.py                                  # main arms x 5 seeds, ablations x 2 seeds
    python benchmarks/compare_tiny.py --arms main --jobs 2             # HACPO, GSPO, GSPO x2, Naive only
    python benchmarks/compare_tiny.py --arms hacpo,gspo --seeds 0 --steps 20   # a quick end-to-end check
    python benchmarks/compare_tiny.py --report_only                    # tables from the runs already on disk
    python benchmarks/compare_tiny.py --regime paper --arms main --seeds 0,1,2,3,4,5,6,7,8,9   # the paper's regime

Every arm is one run of ``python -m openrlhf_hacpo.cli.tiny run`` (so of the normal ``train_hacpo`` command) with
the preset's RL settings; runs with the same seed see the same prompt batches, so arms are compared paired by seed.
Every run trains the agents that ship with the package (``--rebuild``: agents built on this machine from the same
recipes); the report names them by their fingerprints (sha256 of the weights), and a run folder that holds a run of
other agents is refused rather than mixed in.

Arms (G = the preset's group size, 8):

* ``hacpo``: every agent trains on its own G and every other agent's G rollouts per prompt;
* ``gspo``: every agent alone on its own G rollouts (the same rollouts per agent as HACPO);
* ``gspo2x``: every agent alone with 2G rollouts per prompt (twice HACPO's own rollouts);
* ``naive-paper``: the paper's naive sharing read literally: shared rollouts, plain joint-mean advantages, no ω, no
  α, no window, so a foreign row enters as s·A (docs/algorithm.md, "Two naives");
* ``naive-gated``: shared rollouts, plain joint-mean advantages, GSPO's own-rollout clip on every row, which on foreign
  rows keeps successes with s < 1 and drops failures (a success-gated transfer; the arm called ``naive`` before);
* ablations: ``no-adv`` (plain joint-mean baseline), ``no-omega`` (no ω on foreign objectives), ``alpha0`` /
  ``alpha2`` / ``alpha3`` (exponent of the exponential importance sampling; α = 1 is ``hacpo``), ``no-clip`` (no
  clamp of foreign ratios); ``hacpo-m2`` / ``no-stepwise`` with two optimizer updates per step (own rows, then
  foreign rows), where the stepwise lower bound of update m = 1 is 1 − δ + δ_step (with one update per step the
  bound is 1 − δ with or without the stepwise rule, so the two would be the same run);
* levers (``--arms levers``, not part of ``all``): ``delta05`` / ``delta1``, HACPO with the foreign window widened
  to [0.5, 1] / [0, 1]; ``high125`` / ``high15``, its upper end raised to 1.25 / 1.5 (``--cross_clip_high``);
  ``pessimistic`` / ``pessimistic-high125``, PPO's min() on foreign rows (``--cross_clip_mode pessimistic``), on
  [0.8, 1] / [0.8, 1.25]; ``pessimistic-no-omega``, the same without the capability coefficient ω;
  ``pessimistic-delta0``, the pessimistic rule on the window [1, 1] (Naive's one-sided rule with HACPO's
  advantages, ω and sg(c)^α), and ``pessimistic-delta0-no-adv`` the same with the plain joint-mean advantage (it
  differs from Naive only by ω on foreign rows); ``eos-keep``, HACPO with the EOS token in the ratio and the loss
  (the main-branch code's behaviour; the default drops it, as v1 does);
* ``lora`` (``--arms lora``, not part of ``all``): HACPO with a LoRA adapter on both agents instead of
  full-parameter training (:data:`LORA_RANK`, :data:`LORA_ALPHA`, :data:`LORA_LR`); ``benchmarks/compare_tiny_lora.py``
  runs it and puts it beside the committed full-parameter HACPO seeds.

``--regime paper`` runs every arm as the paper's code trains (mini-batches of 64 rows: GSPO 2 optimizer updates per
step, HACPO, the naives and GSPO ×2 4; :data:`openrlhf_hacpo.zoo.presets.REGIMES`); its runs go to
``<preset>-<steps>steps-paper`` and its report to ``tiny_<preset>_paper.*``. The two-update arms ``hacpo-m2`` and
``no-stepwise`` set two updates per step for the single-update regime; ``hacpo-m2`` runs only there, and in the
paper's regime ``no-stepwise`` takes the regime's updates (HACPO's 4) and is compared with ``hacpo``.

Every run records the commit of the code that ran it (and whether the checkout had uncommitted changes); the report
refuses runs of different commits (or of a changed checkout) in one table unless ``--allow_mixed_commits``, and then
names each arm's commits. The evidence section gives, per agent and comparison, the paired differences by seed with
their 95% t-interval and exact sign-flip p-value (:mod:`openrlhf_hacpo.zoo.evidence`), Holm's correction over the
primary comparisons (:data:`PRIMARY_COMPARISONS`), the area under each validation curve and how many runs ended below
their start.

Per arm and agent it reports the final test accuracy (mean of the last two periodic evaluations; mean ± sample std
over seeds), rollouts generated, wall time, tokens/s, seconds per phase, and the foreign-ratio statistics logged
by the trainer. It writes ``benchmarks/results/tiny_<preset>.{md,json,png}`` (``tiny_<preset>_<N>steps`` for a
non-default step count) atomically when every run succeeded (else the report of the finished runs and the failed
ones go to ``tiny_<preset>.failed.md`` beside the committed files, which stay as they were); the JSON also holds
each arm's settings, so the main job can put a run beside its arm's seed spread (:mod:`openrlhf_hacpo.zoo.reference`).
A run whose folder already holds a ``summary.json`` with the same settings is not repeated, so the comparison can be
run in pieces.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from openrlhf_hacpo.utils.atomic import atomic_write_json
from openrlhf_hacpo.zoo import DEFAULT_PRESET, PRESETS, REGIMES, get_preset, get_regime
from openrlhf_hacpo.zoo import evidence
from openrlhf_hacpo.zoo.presets import DEFAULT_REGIME
from openrlhf_hacpo.zoo.reference import report_stem
from openrlhf_hacpo.zoo.job import default_runs_dir
from openrlhf_hacpo.zoo.shipped import agent_folders, agent_records
from openrlhf_hacpo.zoo.reports import (
    agent_step_stats,
    aggregate_arm,
    fmt,
    fmt_pm,
    load_summary,
    paired_differences,
    read_records,
)

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "benchmarks") not in sys.path:  # imported from a file path (tests), not run as a script
    sys.path.insert(0, str(REPO / "benchmarks"))
from results_io import ResultWriter, figure_png, pyplot  # noqa: E402
import mismatch_curves  # noqa: E402
import window_probe  # noqa: E402
RESULTS_DIR = REPO / "benchmarks" / "results"
COMMANDS_FILE = "commands.txt"
"""Every command that ran arms into a runs folder, one per line (listed in the report)."""


LORA_RANK, LORA_ALPHA, LORA_LR = 8, 32, 1e-3
"""The LoRA arm's adapter on every linear layer of both agents (``lora``; benchmarks/compare_tiny_lora.py): rank 8 of
hidden sizes 64 and 96, α = 32 (the scale α / r = 4), and a learning rate of 1e-3, 3.3x the full-parameter rate of
the preset (3e-4). The 10x ratio Schulman et al. 2025 ("LoRA Without Regret") measured between the best LoRA and
full fine-tuning learning rates with α = 32, 3e-3, left qwenM below its accuracy before training (its evaluations
fell to 0.05-0.14 around steps 20-30); one learning rate serves both agents, as the main job's ``--agent`` specs
are its own (a per-agent ``learning_rate`` exists in the trainer's agent spec, not in this arm)."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One configuration of the comparison.

    ``group_factor`` multiplies the preset's G; ``updates_per_step`` splits a learner's batch into that many
    optimizer updates; ``extra`` are further trainer flags."""

    name: str
    label: str
    algorithm: str
    kind: str = "main"
    group_factor: int = 1
    updates_per_step: int = 1
    extra: tuple[str, ...] = ()
    reference: str | None = None
    """For an ablation or lever: the arm it is compared with, paired by seed."""
    also_against: str | None = None
    """A second arm it is compared with, paired by seed (a correction: the bf16 engines without it)."""
    updates_are_the_point: bool = True
    """Whether ``updates_per_step`` is what the arm measures (``hacpo-m2``): such an arm runs in the single-update
    regime only. ``False`` (``no-stepwise``): the updates only give the ablated rule something to act on, and a
    regime with several updates of its own (``paper``) runs the arm with the regime's updates instead."""

    def group_size(self, preset) -> int:
        return preset.rl.group_size * self.group_factor

    def trainer_flags(self, preset, regime: str = DEFAULT_REGIME) -> list[str]:
        flags = list(self.extra)
        regime_updates = get_regime(regime).rows_per_update is not None
        if self.updates_per_step > 1 and regime_updates and not self.updates_are_the_point:
            return flags  # the regime's own updates (several per step) take the place of the arm's
        if self.updates_per_step > 1 and regime_updates:
            raise ValueError(f"arm {self.name} sets its own updates per step; it belongs to the {DEFAULT_REGIME} "
                             f"regime, not {regime!r}")
        if self.updates_per_step > 1:
            from openrlhf_hacpo.algorithms import HACPOConfig

            sources = len(preset.agents) if HACPOConfig.preset(self.algorithm).trains_on_foreign else 1
            rows = sources * preset.rl.prompts_per_step * self.group_size(preset)
            if rows % self.updates_per_step:
                raise ValueError(f"arm {self.name}: {rows} rows per step do not split into "
                                 f"{self.updates_per_step} updates")
            per_update = rows // self.updates_per_step
            flags += ["--train_batch_size", str(per_update), "--micro_train_batch_size", str(math.gcd(per_update, 64))]
        return flags


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("hacpo", "HACPO", "hacpo"),
    Arm("gspo", "GSPO (same rollouts)", "gspo"),
    Arm("gspo2x", "GSPO ×2 (2G rollouts)", "gspo", group_factor=2),
    Arm("naive-paper", "Naive (paper: s·A on foreign rows)", "naive-paper"),
    Arm("naive-gated", "Naive, success-gated (GSPO clip on foreign rows)", "naive-gated"),
    Arm("no-adv", "HACPO −Adv (plain joint baseline)", "hacpo-no-adv", kind="ablation", reference="hacpo"),
    Arm("no-omega", "HACPO −ω", "hacpo-no-omega", kind="ablation", reference="hacpo"),
    Arm("alpha0", "HACPO α=0", "hacpo", kind="ablation", reference="hacpo", extra=("--alpha", "0")),
    Arm("alpha2", "HACPO α=2", "hacpo", kind="ablation", reference="hacpo", extra=("--alpha", "2")),
    Arm("alpha3", "HACPO α=3", "hacpo", kind="ablation", reference="hacpo", extra=("--alpha", "3")),
    Arm("no-clip", "HACPO, no foreign clip", "hacpo-no-clip", kind="ablation", reference="hacpo"),
    Arm("hacpo-m2", "HACPO, 2 updates/step", "hacpo", kind="ablation", reference="hacpo", updates_per_step=2),
    Arm("no-stepwise", "HACPO −stepwise (2 updates/step in the single-update regime)", "hacpo-no-stepwise",
        kind="ablation", reference="hacpo-m2", updates_per_step=2, updates_are_the_point=False),
    Arm("delta05", "HACPO, window [0.5, 1]", "hacpo", kind="lever", reference="hacpo",
        extra=("--cross_clip_delta", "0.5")),
    Arm("delta1", "HACPO, window [0, 1]", "hacpo", kind="lever", reference="hacpo", extra=("--cross_clip_delta", "1")),
    Arm("high125", "HACPO, window [0.8, 1.25]", "hacpo", kind="lever", reference="hacpo",
        extra=("--cross_clip_high", "1.25")),
    Arm("high15", "HACPO, window [0.8, 1.5]", "hacpo", kind="lever", reference="hacpo",
        extra=("--cross_clip_high", "1.5")),
    Arm("pessimistic", "HACPO, pessimistic foreign rule", "hacpo", kind="lever", reference="hacpo",
        extra=("--cross_clip_mode", "pessimistic")),
    Arm("pessimistic-high125", "HACPO, pessimistic, window [0.8, 1.25]", "hacpo", kind="lever", reference="hacpo",
        extra=("--cross_clip_mode", "pessimistic", "--cross_clip_high", "1.25")),
    Arm("pessimistic-no-omega", "HACPO, pessimistic, −ω", "hacpo-no-omega", kind="lever", reference="pessimistic",
        extra=("--cross_clip_mode", "pessimistic")),
    Arm("pessimistic-delta0", "HACPO, pessimistic, window [1, 1]", "hacpo", kind="lever", reference="pessimistic",
        extra=("--cross_clip_mode", "pessimistic", "--cross_clip_delta", "0")),
    Arm("pessimistic-delta0-no-adv", "HACPO, pessimistic, window [1, 1], −Adv", "hacpo-no-adv", kind="lever",
        reference="pessimistic-delta0", extra=("--cross_clip_mode", "pessimistic", "--cross_clip_delta", "0")),
    Arm("eos-keep", "HACPO, EOS trained (--eos_policy keep)", "hacpo", kind="lever", reference="hacpo",
        extra=("--eos_policy", "keep")),
    Arm("lora", f"HACPO, LoRA r={LORA_RANK} (α {LORA_ALPHA}, lr {LORA_LR:g})", "hacpo", kind="lora",
        reference="hacpo", extra=("--lora_rank", str(LORA_RANK), "--lora_alpha", str(LORA_ALPHA),
                                  "--actor_learning_rate", f"{LORA_LR:g}")),
    Arm("hacpo-overlap", "HACPO, one step off (behaviour old log-probs)", "hacpo", kind="overlap",
        reference="hacpo", extra=("--rollout_backend", "hf_engine", "--one_step_off", "--own_old_logp", "behaviour")),
    Arm("hacpo-overlap-recompute", "HACPO, one step off (recomputed old log-probs)", "hacpo", kind="overlap",
        reference="hacpo", extra=("--rollout_backend", "hf_engine", "--one_step_off", "--own_old_logp", "recompute")),
    Arm("engines-fp32", "HACPO, hf_engine, fp32 engines", "hacpo", kind="mismatch",
        extra=("--rollout_backend", "hf_engine")),
    Arm("engines-bf16", "HACPO, hf_engine, bf16 engines", "hacpo", kind="mismatch", reference="engines-fp32",
        extra=("--rollout_backend", "hf_engine", "--engine_dtype", "bfloat16")),
    *(Arm(f"bf16-is-{level[:3]}-{mode}", f"HACPO, bf16 engines, --rollout_is {level} {mode}", "hacpo",
          kind="mismatch", reference="engines-fp32", also_against="engines-bf16",
          extra=("--rollout_backend", "hf_engine", "--engine_dtype", "bfloat16", "--rollout_is",
                 "--rollout_is_level", level, "--rollout_is_mode", mode))
      for level in ("sequence", "token") for mode in ("truncate", "mask")),
)}
MAIN_COMPARISONS = (("hacpo", "gspo"), ("hacpo", "gspo2x"), ("hacpo", "naive-paper"), ("hacpo", "naive-gated"))
"""(arm, baseline) pairs of the headline comparison."""
PRIMARY_COMPARISONS = (("hacpo", "gspo2x"), ("hacpo", "naive-paper"), ("hacpo", "naive-gated"))
"""The pre-registered primary comparisons: for every agent, HACPO − each of these; Holm's correction runs over all
of them (agents × comparisons)."""
PAPER_ORDERINGS = (("hacpo", "gspo"), ("hacpo", "gspo2x"), ("hacpo", "naive-paper"), ("hacpo", "naive-gated"),
                   ("gspo", "naive-paper"), ("gspo", "naive-gated"))
"""The paper's orderings, each "first above second" for every agent (Tables 1 and 7: HACPO above GSPO, GSPO ×2 and
Naive; Naive below single-agent GSPO), judged on the 95% interval of the paired differences."""
GROUPS = {"main": [a for a in ARMS if ARMS[a].kind == "main"],
          "ablations": [a for a in ARMS if ARMS[a].kind == "ablation"],
          "levers": [a for a in ARMS if ARMS[a].kind == "lever"],
          "mismatch": [a for a in ARMS if ARMS[a].kind == "mismatch"]}
GROUPS["all"] = GROUPS["main"] + GROUPS["ablations"]
DEFAULT_SEEDS = {"main": (0, 1, 2, 3, 4), "ablation": (0, 1), "lever": (0, 1), "lora": (0, 1, 2),
                 "overlap": (0, 1, 2, 3, 4), "mismatch": (0, 1, 2, 3, 4)}


def _log(message: str) -> None:
    print(f"[compare {datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------- running
def run_dir(root: Path, arm: Arm, seed: int) -> Path:
    return root / arm.name / f"seed{seed}"


def run_command(arm: Arm, preset, seed: int, steps: int, output: Path, rebuild: bool = False,
                regime: str = DEFAULT_REGIME) -> list[str]:
    """The main-job command of one arm and seed."""
    cmd = [sys.executable, "-m", "openrlhf_hacpo.cli.tiny", "run", "--preset", preset.name,
           "--algorithm", arm.algorithm, "--regime", regime, "--n_samples_per_prompt", str(arm.group_size(preset)),
           "--steps", str(steps), "--seed", str(seed), "--output", str(output), "--no_progress_bar"]
    if rebuild:
        cmd.append("--rebuild")
    flags = arm.trainer_flags(preset, regime)
    return cmd + (["--", *flags] if flags else [])


def arm_settings(arm: Arm, preset, regime: str = DEFAULT_REGIME) -> dict[str, Any]:
    """What a run of ``arm`` records in its summary, and the main job matches against the report's arms."""
    return {"algorithm": arm.algorithm, "regime": regime, "n_samples_per_prompt": arm.group_size(preset),
            "extra_args": arm.trainer_flags(preset, regime)}


def run_fingerprints(summary: Mapping[str, Any]) -> dict[str, str | None]:
    """``{agent: weights fingerprint}`` a run recorded (``None`` for runs made before agents had fingerprints)."""
    used = summary["run"].get("agents_used") or {}
    return {name: (used.get(name) or {}).get("fingerprint") for name in summary["agents"]}


def finished(arm: Arm, preset, seed: int, steps: int, output: Path,
             fingerprints: Mapping[str, str] | None = None, regime: str = DEFAULT_REGIME) -> bool:
    """True when ``output`` holds the summary of exactly this arm, seed and step count (and, when ``fingerprints``
    is given, of exactly these agents)."""
    summary = load_summary(output)
    if summary is None:
        return False
    run = summary["run"]
    wanted = {"preset": preset.name, "seed": seed, "steps": steps, **arm_settings(arm, preset, regime)}
    ran = {**run, "regime": run.get("regime", DEFAULT_REGIME)}  # runs made before regimes were single-update
    differs = {k: (ran.get(k), v) for k, v in wanted.items() if ran.get(k) != v}
    if differs:
        raise ValueError(f"{output} holds a run with other settings {differs}; remove it or use another --runs_dir")
    if fingerprints is not None:
        ran = run_fingerprints(summary)
        if ran != dict(fingerprints):
            raise ValueError(f"{output} holds a run of other agents (fingerprints {ran}, now {dict(fingerprints)}); "
                             "remove it or use another --runs_dir")
    return True


def run_all(jobs: Sequence[tuple[Arm, int]], preset, steps: int, root: Path, lanes: int,
            fingerprints: Mapping[str, str] | None = None, rebuild: bool = False,
            regime: str = DEFAULT_REGIME) -> list[str]:
    """Run the missing (arm, seed) jobs on ``lanes`` parallel lanes; returns the failures."""
    todo = [(arm, seed) for arm, seed in jobs
            if not finished(arm, preset, seed, steps, run_dir(root, arm, seed), fingerprints, regime)]
    skipped = len(jobs) - len(todo)
    if skipped:
        _log(f"{skipped} run(s) already done, {len(todo)} to go")
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(1, len(todo) + 1))

    def one(job: tuple[Arm, int]) -> None:
        arm, seed = job
        out = run_dir(root, arm, seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = run_command(arm, preset, seed, steps, out, rebuild, regime)
        with lock:
            _log(f"start {arm.name} seed {seed} ({next(counter)}/{len(todo)}): {shlex.join(cmd[1:])}")
        t0 = time.perf_counter()
        log_path = out.parent / f"seed{seed}.log"
        with open(log_path, "w", encoding="utf-8") as log:
            status = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
                                    ).returncode
        seconds = time.perf_counter() - t0
        with lock:
            if status != 0:
                failures.append(f"{arm.name} seed {seed} (status {status}, log {log_path})")
                _log(f"FAILED {arm.name} seed {seed} after {seconds:.0f} s; see {log_path}")
                return
            summary = load_summary(out)
            accs = ", ".join(f"{n} {a['acc_before']:.3f}→{a['acc_final']:.3f}" for n, a in summary["agents"].items())
            _log(f"done {arm.name} seed {seed} in {seconds:.0f} s: {accs}")

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        list(pool.map(one, todo))
    return failures


# ---------------------------------------------------------------------------------------------------------- goals
GOAL_SUBJECTS = ("hacpo", "pessimistic")
"""Arms judged against the goals: HACPO as specified, and the best measured extension (pessimistic foreign rule)."""


def goal_checks(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The defaults' goals, per agent: HACPO > GSPO, HACPO ≥ GSPO ×2, Naive < HACPO, judged on the paired differences
    (for HACPO and for each arm of :data:`GOAL_SUBJECTS` on disk): ``met`` is "yes, every seed", "on average" (the
    mean difference only) or "no"."""
    checks = []
    for subject in GOAL_SUBJECTS:
        for other, relation in (("gspo", "above"), ("gspo2x", "level"), ("naive-paper", "above"),
                                ("naive-gated", "above")):
            if subject not in results or other not in results:
                continue
            for name, d in paired_differences(results[subject], results[other]).items():
                if d["mean"] is None:
                    continue
                ok = (lambda x: x > 0) if relation == "above" else (lambda x: x >= 0)
                met = "yes, every seed" if all(ok(x) for x in d["diffs"]) else "on average" if ok(d["mean"]) else "no"
                goal = f"{ARMS[subject].label} {'>' if relation == 'above' else '≥'} {ARMS[other].label}"
                checks.append({"agent": name, "goal": goal, "paired_mean": d["mean"], "paired_std": d["std"],
                               "positive_seeds": d["positive"], "seeds": len(d["diffs"]), "met": met})
    return checks


# ---------------------------------------------------------------------------------------------------------- ratio probe
def ratio_probes(root: Path, preset, found: Mapping[str, Mapping[int, Any]], start: Mapping[str, Path],
                 num_prompts: int = 64) -> dict[str, Any]:
    """The window probe (:mod:`window_probe`) on the warm-started agents and on the final agents of each seed-0
    sharing run (cached in ``<root>/ratio_probe.json``)."""
    targets = {"start (warm-started agents)": dict(start)}
    for arm in ("hacpo", "naive-paper", "naive-gated"):
        if 0 in found.get(arm, {}):
            folder = run_dir(root, ARMS[arm], 0) / "hf"
            targets[f"end of {ARMS[arm].label}, seed 0"] = {n: folder / n for n in preset.agent_names}
    return window_probe.ratio_probes(root, preset, targets, num_prompts, log=_log)


def window_curves(root: Path, found: Mapping[str, Mapping[int, Any]], agents: Sequence[str]) -> dict[str, Any]:
    """Per sharing arm, the trainer's per-step window fractions (A > 0 and A < 0 apart) averaged over its seeds."""
    return {name: window_probe.window_over_training([run_dir(root, ARMS[name], s) for s in found[name]], agents)
            for name in ("hacpo", "naive-paper", "naive-gated") if name in found}


# ---------------------------------------------------------------------------------------------------------- report
def _agents_line(meta: Mapping[str, Any]) -> str:
    """Which agents the runs trained, by weights fingerprint (sha256 of ``model.safetensors``, 12 hex digits)."""
    records = meta.get("agent_fingerprints")
    if not records:
        return "Agents: built on first use before the agents shipped with the package (no fingerprints recorded)."
    parts = []
    for name, r in records.items():
        if r["source"] == "shipped":
            parts.append(f"{name} `{r['fingerprint']}` (shipped)")
        else:
            parts.append(f"{name} `{r['fingerprint']}` (rebuilt on this machine; the shipped agent is "
                         f"`{r['shipped_fingerprint']}`)")
    return "Agents (weights sha256): " + ", ".join(parts) + "."


def _commits_line(report: Mapping[str, Any]) -> str:
    """Which commit the runs ran at; with mixed commits, each arm's (marked)."""
    labels = report["meta"].get("commits")
    if not labels:
        return "Commit: not recorded (runs made before runs recorded their commit)."
    if len(labels) == 1 and not report["meta"].get("mixed_commits"):
        return f"Every run at commit `{labels[0]}`."
    return ("**Mixed commits** (merged with `--allow_mixed_commits`): " + "; ".join(
        f"{ARMS[name].label}: " + ", ".join(f"`{c}` seeds {seeds}" for c, seeds in r.get("commits", {}).items())
        for name, r in report["arms"].items()) + ".")


def _evidence_lines(report: Mapping[str, Any], agents: Sequence[str]) -> list[str]:
    """The statistics section: paired differences with intervals and p-values, Holm, curve areas, runs below start."""
    ev = report.get("evidence")
    if not ev:
        return []
    lines = ["", "## Paired comparisons: intervals and exact tests", "",
             "Per agent: the mean of the per-seed differences of final accuracy, its 95% t-interval, the seeds with a "
             "positive difference, the exact two-sided sign-flip p-value (all 2^n sign patterns) and, for the "
             "primary comparisons (" + ", ".join(f"`{k}`" for k in ev["primary"]) + ", for every agent), Holm's "
             "adjusted p over that family.", "",
             "| comparison | agent | n | mean [95% CI] | > 0 | p (sign flip) | p (Holm) |", "|---|---|---|---|---|---|---|"]
    for key, per_agent in ev["comparisons"].items():
        a, b = key.split(" - ")
        for agent in agents:
            d = per_agent[agent]
            ci = (f" [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d["ci_low"] is not None else "")
            holm = fmt(d.get("p_holm")) if "p_holm" in d else "–"
            lines.append(f"| {ARMS[a].label} − {ARMS[b].label} | {agent} | {d['n']} | {fmt(d['mean'], signed=True)}{ci} "
                         f"| {d['positive']}/{d['n']} | {fmt(d['p_sign_flip'])} | {holm} |")
    if ev.get("orderings"):
        lines += ["", "The paper's orderings (every agent; Tables 1 and 7), judged on the 95% interval of the paired "
                  "difference: **holds** when it lies above 0, **reversed** when below, **not resolved** when it "
                  "contains 0.", "", "| paper's claim | agent | n | mean [95% CI] | here |", "|---|---|---|---|---|"]
        for o in ev["orderings"]:
            a, b = o["claim"].split(" > ")
            lines.append(f"| {ARMS[a].label} > {ARMS[b].label} | {o['agent']} | {o['n']} | {o['mean']:+.3f} "
                         f"[{o['ci_low']:+.3f}, {o['ci_high']:+.3f}] | {o['verdict']} |")
    lines += ["", "Area under the validation curve (mean accuracy over training, trapezoids between evaluations; mean ± "
              "std over seeds) and the runs whose final accuracy ended below their accuracy before training:", "",
              "| arm | " + " | ".join(f"{a} AUC | {a} below start" for a in agents) + " |",
              "|---|" + "---|---|" * len(agents)]
    for arm, per_agent in ev["curves"].items():
        lines.append(f"| {ARMS[arm].label} | " + " | ".join(
            f"{fmt_pm(per_agent[a]['auc_mean'], per_agent[a]['auc_std'])} | {per_agent[a]['below_start']}/"
            f"{per_agent[a]['runs']}" for a in agents) + " |")
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    res = report["arms"]
    meta = report["meta"]
    agents = meta["agents"]
    lines = [
        f"# HACPO vs GSPO on the tiny agents: preset `{meta['preset']}` ({' + '.join(agents)})",
        "",
        "Made by: " + "; ".join(f"`{c}`" for c in meta["commands"]) + "  ",
        f"Measured {meta['date']} on {meta['cpu_count']} CPU cores ({meta['machine']}), "
        f"{meta['omp_num_threads']} thread per process, {meta['lanes']} run(s) at a time; "
        f"torch {meta['versions'].get('torch')}, transformers {meta['versions'].get('transformers')}, "
        f"deepspeed {meta['versions'].get('deepspeed')}, ray {meta['versions'].get('ray')}.  ",
        _agents_line(meta) + "  ",
        f"{meta['steps']} steps × {meta['prompts_per_step']} prompts, T = 1, regime `{meta.get('regime', DEFAULT_REGIME)}`: "
        f"{meta.get('regime_description') or get_regime(DEFAULT_REGIME).description} (10-step warmup). "
        "**Final** = mean of the greedy test accuracies (400 L4 problems) at the last "
        "two evaluations (every 10 steps); mean ± sample std over seeds. Arms with the same seed see the same prompts.  ",
        _commits_line(report),
        "",
        "## Final test accuracy",
        "",
        "| arm | seeds | " + " | ".join(f"{a} final" for a in agents) + " | rollouts / agent | rows trained / agent "
        "| wall s / run |",
        "|---|---|" + "---|" * len(agents) + "---|---|---|",
    ]
    for name, r in res.items():
        first = r["agents"][agents[0]]
        lines.append(
            f"| {ARMS[name].label} | {len(r['seeds'])} | "
            + " | ".join(fmt_pm(r["agents"][a]["final_mean"], r["agents"][a]["final_std"]) for a in agents)
            + f" | {first['rollouts_generated']:,.0f} | {first['rows_trained']:,.0f} | {fmt(r['wall_seconds'], 0)} |")
    before = {a: next(iter(res.values()))["agents"][a]["acc_before"] for a in agents} if res else {}
    lines += ["", "Before training: " + ", ".join(f"{a} {before[a]:.3f}" for a in agents) + "."]

    lines += ["", "## Paired differences (final accuracy, same seeds)", "",
              "| comparison | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents)]
    pairs_to_show = [p for p in MAIN_COMPARISONS if p[0] in res and p[1] in res]
    pairs_to_show += [(subject, other) for subject in GOAL_SUBJECTS[1:] for _, other in MAIN_COMPARISONS
                      if subject in res and other in res]
    regime = meta.get("regime", DEFAULT_REGIME)
    pairs_to_show += [(n, reference_of(ARMS[n], regime)) for n in res if reference_of(ARMS[n], regime) in res]
    for name, ref in pairs_to_show:
        pairs = paired_differences(res[name], res[ref])
        cells = []
        for a in agents:
            d = pairs.get(a)
            cells.append("–" if d is None or d["mean"] is None else
                         f"{fmt_pm(d['mean'], d['std'], signed=True)} ({d['positive']}/{len(d['diffs'])} seeds > 0)")
        lines.append(f"| {ARMS[name].label} − {ARMS[ref].label} | " + " | ".join(cells) + " |")

    lines += _evidence_lines(report, agents)

    if report["goals"]:
        lines += ["", "## Goals of the defaults", "", "| agent | goal | paired mean difference | seeds > 0 | met |",
                  "|---|---|---|---|---|"]
        for g in report["goals"]:
            lines.append(f"| {g['agent']} | {g['goal']} | {fmt_pm(g['paired_mean'], g['paired_std'], signed=True)} | "
                         f"{g['positive_seeds']}/{g['seeds']} | {g['met']} |")

    lines += ["", "## Foreign rollouts (trainer metrics, mean over steps and seeds)", "",
              "Fraction of the other agents' rollouts whose sequence ratio s = π_learner/π_source falls inside the clip "
              "window [1 − δ + m·δ_step, high] (high = 1 unless stated), below it, and above it; the mean and median "
              "of s; and the same three fractions among the foreign rollouts with a positive advantage (the ones "
              "that can teach; logged by the trainer since the median was added, – for older runs).",
              "", "| arm | learner | in window | below | above | mean s | median s | A > 0: in / below / above |",
              "|---|---|---|---|---|---|---|---|"]
    any_median = False
    for name, r in res.items():
        for a in agents:
            f = r["agents"][a]["foreign"]
            if not f:
                continue
            any_median |= f.get("ratio_median") is not None
            lines.append(f"| {ARMS[name].label} | {a} | {fmt(f['in_window_frac'])} | {fmt(f['below_window_frac'])} | "
                         f"{fmt(f['above_window_frac'])} | {fmt(f['ratio_mean'])} | {fmt(f.get('ratio_median'))} | "
                         + (" / ".join(fmt(f.get(k)) for k in ("pos_in_window_frac", "pos_below_window_frac",
                                                              "pos_above_window_frac"))
                            if f.get("pos_in_window_frac") is not None else "–") + " |")
    if "naive-gated" in res:
        lines += ["", "The success-gated naive applies the own-rollout clip [1 − 3e-4, 1 + 4e-4] to every row, so its "
                  "window columns count foreign rollouts inside / below / above that clip; only its mean s compares "
                  "with HACPO's. The paper's naive has no window: its columns count HACPO's window [0.8, 1], which "
                  "it does not apply."]
    if not any_median:
        lines += ["", "The trainer logs the mean of s and the fractions below / inside / above the window, not the "
                  "median, so the median column is empty; the ratio probe below measures the median."]

    if report.get("ratio_probe"):
        lines += ["", "## Ratio probe: correct and wrong samples against the window", "",
                  "The other agent's samples (64 validation prompts × G at T = 1) scored by each learner: the sequence "
                  "ratio s as the trainer computes it (learner's chat template and tokenization, EOS not scored), "
                  "for the warm-started agents and for the final agents of the seed-0 sharing runs; correct and wrong "
                  "samples apart (benchmarks/window_probe.py explains the columns).", ""]
        lines += window_probe.probe_lines(report["ratio_probe"])
    if report.get("window_curves"):
        lines += ["", "The trainer's fractions of foreign rows below / inside / above the window at every step, with "
                  "A > 0 and A < 0 apart (mean over seeds), are plotted in the report's `_window.png`."]

    lines += mismatch_curves.mismatch_lines(report.get("mismatch_curves") or {}, {n: a.label for n, a in ARMS.items()})

    lines += ["", "## Throughput (mean seconds per step; the agents of a run work concurrently)", "",
              "| arm | agent | step s | generate s | log-prob s | update s | samples trained / s | tokens generated / s |",
              "|---|---|---|---|---|---|---|---|"]
    main = [n for n in ("hacpo", "gspo", "gspo2x", "naive-paper", "naive-gated") if n in res]
    for name in main + [n for n in res if n not in main]:  # the main arms first, then every other arm reported
        for a in agents:
            e = res[name]["agents"][a]
            s = e["seconds"]
            lines.append(f"| {ARMS[name].label} | {a} | {fmt(s.get('step'), 2)} | {fmt(s.get('generate'), 2)} | "
                         f"{fmt(s.get('logprob'), 2)} | {fmt(s.get('update'), 2)} | {fmt(e['samples_trained_per_s'], 0)} | "
                         f"{fmt(e['tokens_per_s'], 0)} |")
    if "hacpo" in res and "gspo" in res:
        h, g = res["hacpo"], res["gspo"]
        step_ratio = h["agents"][agents[0]]["seconds"]["step"] / g["agents"][agents[0]]["seconds"]["step"]
        lines += ["", f"HACPO's step takes {step_ratio:.2f}× GSPO's on the same rollouts: every learner also scores and "
                  "trains on the other agents' rollouts (" + ", ".join(
                      f"{a}: update {h['agents'][a]['seconds']['update']:.2f} s vs "
                      f"{g['agents'][a]['seconds']['update']:.2f} s" for a in agents) + ")."]
    return "\n".join(lines) + "\n"


def render_plot(report: Mapping[str, Any]) -> bytes:
    """Mean greedy test accuracy (± std band) against the rollouts each agent generated, one panel per agent: the main
    arms, or every arm of a report without them (``--arms mismatch``)."""
    plt = pyplot()

    res = report["arms"]
    agents = report["meta"]["agents"]
    shown = [name for name in res if ARMS[name].kind == "main"] or list(res)
    fig, axes = plt.subplots(1, len(agents), figsize=(5.2 * len(agents), 4.0), dpi=120, squeeze=False)
    for ax, agent in zip(axes[0], agents):
        for name, r in res.items():
            if name not in shown:
                continue
            e = r["agents"][agent]
            xs = [st * e["rollouts_per_step"] for st, _, _ in e["curve"]]
            ms = [m for _, m, _ in e["curve"]]
            sds = [sd for _, _, sd in e["curve"]]
            line, = ax.plot(xs, ms, marker="o", markersize=3, label=f"{ARMS[name].label} ({len(r['seeds'])} seeds)")
            ax.fill_between(xs, [m - s for m, s in zip(ms, sds)], [m + s for m, s in zip(ms, sds)],
                            color=line.get_color(), alpha=0.15)
        ax.set_title(agent)
        ax.set_xlabel("rollouts generated by this agent")
        ax.set_ylabel("greedy test accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    agents_note = ("" if report["meta"].get("agent_fingerprints") else
                   "\nprevious agents, built on first use before the agents shipped (not the shipped ones)")
    return figure_png(fig, f"preset {report['meta']['preset']}: accuracy against rollouts (mean ± std over seeds)"
                           f"{agents_note}")


def runs_in_regime(arm: Arm, regime: str) -> bool:
    """Whether ``arm`` can run in ``regime``: an arm whose point is its own updates per step (``hacpo-m2``) belongs to
    the single-update regime; ``no-stepwise`` runs in both (:attr:`Arm.updates_are_the_point`)."""
    return (arm.updates_per_step == 1 or not arm.updates_are_the_point
            or get_regime(regime).rows_per_update is None)


def reference_of(arm: Arm, regime: str) -> str | None:
    """The arm ``arm`` is compared with: in a regime of several updates per step, ``no-stepwise`` against ``hacpo``
    (``hacpo-m2``, its single-update-regime reference, does not run there)."""
    if arm.reference is not None and not runs_in_regime(ARMS[arm.reference], regime):
        return "hacpo"
    return arm.reference


def collect(root: Path, preset, steps: int, fingerprints: Mapping[str, str] | None = None,
            regime: str = DEFAULT_REGIME) -> dict[str, dict[int, Any]]:
    """Every finished run under ``root`` for the known arms, ``{arm: {seed: summary}}`` (runs of other agents than
    ``fingerprints`` are refused)."""
    found: dict[str, dict[int, Any]] = {}
    for name, arm in ARMS.items():
        folder = root / name
        if not folder.is_dir() or not runs_in_regime(arm, regime):
            continue
        for sub in sorted(folder.iterdir()):
            if not (sub.is_dir() and sub.name.startswith("seed") and sub.name[4:].isdigit()):
                continue
            seed = int(sub.name[4:])
            if finished(arm, preset, seed, steps, sub, fingerprints, regime):
                found.setdefault(name, {})[seed] = _with_current_foreign_stats(load_summary(sub), sub)
    return found


def _with_current_foreign_stats(summary: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The summary with each agent's foreign-ratio statistics recomputed from the run's ``metrics.jsonl`` by the
    current :func:`~openrlhf_hacpo.zoo.reports.agent_step_stats`, so runs summarised before a statistic was added
    report it too when the trainer logged it."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return summary
    records = read_records(path)
    for name, entry in summary["agents"].items():
        mine = [r for r in records if r.get("agent") == name]
        if mine and entry.get("foreign"):
            entry["foreign"] = agent_step_stats(mine, 1)["foreign"]
    return summary


def run_commits(found: Mapping[str, Mapping[int, Any]]) -> dict[str, dict[str, list[int]]]:
    """``{arm: {commit label: [seeds]}}`` of the runs found; a label is the commit's first 12 hex digits, with
    ``+changes`` for a checkout that differed from it, or ``unknown`` for runs that recorded none."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, runs in found.items():
        for seed, summary in sorted(runs.items()):
            run = summary["run"]
            label = (run.get("commit") or "unknown")[:12] + ("+changes" if run.get("dirty") else "")
            out.setdefault(name, {}).setdefault(label, []).append(seed)
    return out


def check_commits(commits: Mapping[str, Mapping[str, list[int]]], allow_mixed: bool) -> list[str]:
    """The distinct commit labels of the runs; raises ``ValueError`` naming each arm's commits when there is more than
    one, or a changed checkout or an unknown commit among them, unless ``allow_mixed``."""
    labels = sorted({label for per_arm in commits.values() for label in per_arm})
    clean = len(labels) == 1 and not labels[0].endswith("+changes") and labels[0] != "unknown"
    if not clean and not allow_mixed:
        detail = "; ".join(f"{arm}: " + ", ".join(f"{label} (seeds {seeds})" for label, seeds in per.items())
                           for arm, per in commits.items())
        raise ValueError(f"the runs are not all of one committed checkout ({detail}); rerun them at one commit "
                         "(a worktree pinned to it) or pass --allow_mixed_commits to report them marked")
    return labels


def evidence_report(arms: Mapping[str, Any], found: Mapping[str, Mapping[int, Any]], agents: Sequence[str],
                    regime: str) -> dict[str, Any]:
    """The statistics of the comparisons (module docstring): paired summaries per agent of the aggregated ``arms``'
    differences (:func:`paired_differences`) for the main comparisons and the ablations, Holm over the primary ones,
    each arm's area under the validation curve and runs below start (from the runs ``found``)."""
    pairs = [p for p in MAIN_COMPARISONS if p[0] in found and p[1] in found]
    pairs += [p for p in PAPER_ORDERINGS if p not in pairs and p[0] in found and p[1] in found]
    pairs += [(n, reference_of(ARMS[n], regime)) for n in found
              if reference_of(ARMS[n], regime) in found and ARMS[n].kind in ("ablation", "mismatch")]
    pairs += [(n, ARMS[n].also_against) for n in found if ARMS[n].also_against in found]
    comparisons: dict[str, dict[str, Any]] = {}
    for a, b in pairs:
        key = f"{a} - {b}"
        paired = paired_differences(arms[a], arms[b])
        comparisons[key] = {agent: {"seeds": paired[agent]["seeds"], "diffs": paired[agent]["diffs"],
                                    **evidence.paired_summary(paired[agent]["diffs"])} for agent in agents}
    family = {f"{agent} | {a} - {b}": comparisons[f"{a} - {b}"][agent]["p_sign_flip"]
              for a, b in PRIMARY_COMPARISONS if f"{a} - {b}" in comparisons for agent in agents
              if comparisons[f"{a} - {b}"][agent]["p_sign_flip"] is not None}
    for label, p_holm in evidence.holm(family).items():
        agent, key = label.split(" | ")
        comparisons[key][agent]["p_holm"] = p_holm
    curves: dict[str, dict[str, Any]] = {}
    for arm, runs in found.items():
        curves[arm] = {}
        for agent in agents:
            aucs = [evidence.curve_auc(s["agents"][agent]["validation"]) for s in runs.values()]
            below = [seed for seed, s in runs.items() if s["agents"][agent]["acc_final"] < s["agents"][agent]["acc_before"]]
            summary = evidence.paired_summary(aucs)  # the mean and interval of the areas (not a difference)
            curves[arm][agent] = {"auc_by_seed": dict(zip(map(str, runs), aucs)), "auc_mean": summary["mean"],
                                  "auc_std": summary["std"], "below_start": len(below), "below_start_seeds": below,
                                  "runs": len(runs)}
    orderings = []
    for a, b in PAPER_ORDERINGS:
        for agent in agents:
            d = comparisons.get(f"{a} - {b}", {}).get(agent)
            if d is None or d["ci_low"] is None:
                continue
            verdict = "holds" if d["ci_low"] > 0 else "reversed" if d["ci_high"] < 0 else "not resolved"
            orderings.append({"claim": f"{a} > {b}", "agent": agent, "mean": d["mean"], "ci_low": d["ci_low"],
                              "ci_high": d["ci_high"], "n": d["n"], "verdict": verdict})
    return {"primary": [f"{a} - {b}" for a, b in PRIMARY_COMPARISONS], "comparisons": comparisons,
            "curves": curves, "orderings": orderings}


def build_report(root: Path, preset, steps: int, command: str, lanes: int,
                 folders: Mapping[str, Path], regime: str = DEFAULT_REGIME,
                 allow_mixed_commits: bool = False) -> dict[str, Any] | None:
    """Aggregate the runs under ``root`` of the agents in ``folders`` (None when no run has finished)."""
    records = agent_records(folders)
    fingerprints = {name: r["fingerprint"] for name, r in records.items()}
    found = collect(root, preset, steps, fingerprints, regime)
    if not found:
        _log(f"no finished runs under {root}")
        return None
    commits = run_commits(found)
    labels = check_commits(commits, allow_mixed_commits)
    arms = {name: {"settings": arm_settings(ARMS[name], preset, regime), **aggregate_arm(found[name]),
                   "commits": commits[name]}
            for name in ARMS if name in found}
    any_run = next(iter(next(iter(found.values())).values()))["run"]
    history = root / COMMANDS_FILE
    commands = list(dict.fromkeys(history.read_text(encoding="utf-8").split("\n"))) if history.is_file() else []
    commands = [c for c in commands if c] or [command]
    report = {
        "meta": {
            "preset": preset.name, "agents": list(preset.agent_names), "steps": steps,
            "agent_fingerprints": {name: {k: r[k] for k in ("fingerprint", "source", "shipped_fingerprint",
                                                             "spec_hash")} for name, r in records.items()},
            "prompts_per_step": preset.rl.prompts_per_step, "commands": commands,
            "date": datetime.date.today().isoformat(), "cpu_count": any_run.get("cpu_count"),
            "machine": platform.machine(), "omp_num_threads": any_run.get("omp_num_threads"), "lanes": lanes,
            "versions": any_run.get("versions", {}), "runs_dir": str(root),
            "regime": regime, "regime_description": get_regime(regime).description,
            "commits": labels, "mixed_commits": len(labels) > 1,
        },
        "evidence": evidence_report(arms, found, list(preset.agent_names), regime),
        "arms": arms,
        "goals": goal_checks(arms),
        "ratio_probe": ratio_probes(root, preset, found, folders),
        "window_curves": window_curves(root, found, list(preset.agent_names)),
        "mismatch_curves": {name: mismatch_curves.mismatch_over_training(
            [run_dir(root, ARMS[name], s) for s in found[name]], list(preset.agent_names))
            for name in arms if ARMS[name].kind == "mismatch"},
        "paired": {f"{a} - {b}": paired_differences(arms[a], arms[b])
                   for a, b in [*MAIN_COMPARISONS, *((n, reference_of(ARMS[n], regime)) for n in ARMS)]
                   if a in arms and b in arms},
    }
    return report


# ---------------------------------------------------------------------------------------------------------- cli
def parse_arms(text: str) -> list[str]:
    names: list[str] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        chosen = GROUPS.get(item, [item])
        for name in chosen:
            if name not in ARMS:
                raise ValueError(f"unknown arm {name!r}; arms: {', '.join(ARMS)}; groups: {', '.join(GROUPS)}")
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError("--arms selects no arm")
    return names


def add_seed_run_options(parser: argparse.ArgumentParser, default_seeds: Sequence[int]) -> None:
    """The options of a script that runs one arm over seeds and compares it with a committed report
    (``compare_tiny_lora.py``, ``compare_tiny_overlap.py``)."""
    parser.add_argument("--seeds", default=",".join(map(str, default_seeds)))
    parser.add_argument("--steps", type=int, default=None, help="training steps per run [preset: 80]")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--runs_dir", type=Path, default=None,
                        help="where run folders go [compare_tiny.py's: <runs>/compare_tiny/model-<steps>steps]")
    parser.add_argument("--results_dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report_only", action="store_true")


def seed_run_meta(arm: Arm, preset, steps: int, root: Path, lanes: int, fingerprints: Mapping[str, str],
                  commands: Sequence[str], found: Mapping[int, Any]) -> dict[str, Any]:
    """What a seed-run report records of its runs (agents, commands, date, machine, versions, the arm's settings)."""
    any_run = next(iter(found.values()))["run"]
    return {"agents": list(preset.agent_names), "steps": steps, "fingerprints": dict(fingerprints),
            "commands": list(commands), "date": datetime.date.today().isoformat(),
            "cpu_count": any_run.get("cpu_count"), "lanes": lanes, "runs_dir": str(root),
            "versions": any_run.get("versions", {}), "settings": arm_settings(arm, preset)}


def provenance_lines(meta: Mapping[str, Any]) -> list[str]:
    """The report's "Made by" line and the start of its "Measured" sentence (date, cores, lanes, steps, agents)."""
    return ["Made by: " + "; ".join(f"`{c}`" for c in meta["commands"]) + "  ",
            f"Measured {meta['date']} on {meta['cpu_count']} CPU cores, {meta['lanes']} run(s) at a time. "
            f"{meta['steps']} steps x 16 prompts x G 8, HACPO, the shipped agents "
            + ", ".join(f"{n} `{f}`" for n, f in meta["fingerprints"].items()) + ". "]


def per_seed_rows(base: Mapping[str, Any], other: Mapping[str, Any], seeds: Sequence[int],
                  agents: Sequence[str]) -> list[str]:
    """Markdown rows ``| seed | base / other | ...`` of two aggregated arms' final accuracies, one per seed."""
    return [f"| {s} | " + " | ".join(f"{fmt(base['agents'][a]['final_by_seed'][str(s)])} / "
                                     f"{fmt(other['agents'][a]['final_by_seed'][str(s)])}" for a in agents) + " |"
            for s in seeds]


def paired_row(label: str, other: Mapping[str, Any], base: Mapping[str, Any], agents: Sequence[str]) -> str:
    """The markdown row of ``other − base`` paired by seed, per agent: mean ± std and the seeds above zero."""
    pairs = paired_differences(other, base)
    return f"| {label} | " + " | ".join(
        f"{fmt_pm(pairs[a]['mean'], pairs[a]['std'], signed=True)} ({pairs[a]['positive']}/{len(pairs[a]['diffs'])} "
        "seeds > 0)" for a in agents) + " |"


def seed_run_setup(parser: argparse.ArgumentParser, args: argparse.Namespace, preset_name: str):
    """``(seeds, preset, steps, runs folder)`` from :func:`add_seed_run_options`' options (``parser.error`` on bad
    ones); one thread per process, as :func:`run_all` runs them."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        seeds = parse_seeds(args.seeds)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    except ValueError as err:
        parser.error(str(err))
    preset = get_preset(preset_name)
    steps = args.steps or preset.rl.num_steps
    root = args.runs_dir or default_runs_dir() / "compare_tiny" / f"{preset.name}-{steps}steps"
    return seeds, preset, steps, root


def run_arm_seeds(arm: Arm, seeds: Sequence[int], preset, steps: int, root: Path, jobs: int,
                  fingerprints: Mapping[str, str], command: str,
                  report_only: bool) -> tuple[dict[int, Any], str | None]:
    """Run ``arm``'s missing seeds into ``root`` (unless ``report_only``; the command is appended to the folder's
    commands file) and collect the finished ones: ``({seed: summary}, None)``, or the failure to report."""
    failures: list[str] = []
    if not report_only:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / COMMANDS_FILE, "a", encoding="utf-8") as f:
            f.write(command + "\n")
        t0 = time.perf_counter()
        failures = run_all([(arm, s) for s in seeds], preset, steps, root, jobs, fingerprints)
        _log(f"runs finished in {time.perf_counter() - t0:.0f} s")
    found = {s: v for s, v in collect(root, preset, steps, fingerprints).get(arm.name, {}).items() if s in seeds}
    if failures or set(found) != set(seeds):
        return found, "failed or missing runs: " + "; ".join(
            failures or [f"seeds {sorted(set(seeds) - set(found))}"])
    return found, None


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"--seeds must name at least one seed >= 0, got {text!r}")
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    parser.add_argument("--regime", default=DEFAULT_REGIME, choices=sorted(REGIMES),
                        help="; ".join(f"{r.name}: {r.description}" for r in REGIMES.values()))
    parser.add_argument("--allow_mixed_commits", action="store_true",
                        help="report runs of different commits (or of a checkout with changes) together, marked")
    parser.add_argument("--arms", default="all",
                        help="arms or groups (main, ablations, levers, all = main + ablations), comma-separated")
    parser.add_argument("--seeds", default=None, help="seeds for every selected arm [main arms 0,1,2; ablations 0,1]")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run [preset: 80]")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each run: one process per agent)")
    parser.add_argument("--runs_dir", type=Path, default=None,
                        help="where run folders go [<runs>/compare_tiny/<preset>-<steps>steps]")
    parser.add_argument("--results_dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report_only", action="store_true", help="only aggregate the runs already on disk")
    parser.add_argument("--rebuild", action="store_true",
                        help="agents built on this machine instead of the shipped ones (default runs folder "
                        "<runs>/compare_tiny/<preset>-<steps>steps-rebuilt)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        arms = parse_arms(args.arms)
        named = {t.strip() for t in args.arms.split(",")}
        refused = [a for a in arms if not runs_in_regime(ARMS[a], args.regime)]
        if any(a in named for a in refused):  # named arms are refused; a group's are left out
            raise ValueError(f"arm(s) {[a for a in refused if a in named]} set their own updates per step and run "
                             f"only in the {DEFAULT_REGIME} regime")
        arms = [a for a in arms if a not in refused]
        seeds = parse_seeds(args.seeds) if args.seeds else None
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
    except ValueError as err:
        parser.error(str(err))
    preset = get_preset(args.preset)
    steps = args.steps or preset.rl.num_steps
    regime_tag = "" if args.regime == DEFAULT_REGIME else f"-{args.regime}"
    root = args.runs_dir or (default_runs_dir() / "compare_tiny"
                             / f"{preset.name}-{steps}steps{regime_tag}{'-rebuilt' if args.rebuild else ''}")
    stem = report_stem(preset.name, steps, preset.rl.num_steps, args.regime)
    command = "python benchmarks/compare_tiny.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))

    # the committed <stem>.{json,md,png} are replaced only when every run succeeded; otherwise the report of the runs
    # that finished goes to <stem>.failed.md beside them, with the failed runs
    with ResultWriter(stem, args.results_dir, command=command.strip(), name="compare_tiny") as out:
        folders = agent_folders(preset.agents, rebuild=args.rebuild, progress=True, jobs=2)
        fingerprints = {name: r["fingerprint"] for name, r in agent_records(folders).items()}
        failures: list[str] = []
        if not args.report_only:
            root.mkdir(parents=True, exist_ok=True)
            with open(root / COMMANDS_FILE, "a", encoding="utf-8") as f:
                f.write(command.strip() + "\n")
            jobs = []
            arm_seeds = {a: seeds or DEFAULT_SEEDS[ARMS[a].kind] for a in arms}
            for seed in sorted({s for ss in arm_seeds.values() for s in ss}):
                jobs += [(ARMS[a], seed) for a in arms if seed in arm_seeds[a]]
            t0 = time.perf_counter()
            failures = run_all(jobs, preset, steps, root, args.jobs, fingerprints, args.rebuild, args.regime)
            _log(f"runs finished in {time.perf_counter() - t0:.0f} s")
        try:
            report = build_report(root, preset, steps, command.strip(), args.jobs, folders, args.regime,
                                  args.allow_mixed_commits)
        except ValueError as err:
            _log(str(err))
            out.fail(str(err))
            return 2
        markdown = render_markdown(report) if report is not None else None
        if failures:
            _log("failed runs: " + "; ".join(failures))
            out.fail("failed runs: " + "; ".join(failures), partial=markdown)
        elif report is None:
            out.fail(f"no finished runs under {root}")
        else:
            files = {".json": report, ".md": markdown, ".png": render_plot(report)}
            if report.get("window_curves"):
                files["_window.png"] = window_probe.render_window_plot(
                    report["window_curves"], f"preset {preset.name}, regime {args.regime}: foreign rows against the "
                    "window (green A > 0, red A < 0; solid inside, dotted below, dashed above)")
            if report.get("mismatch_curves"):
                files["_mismatch.png"] = mismatch_curves.render_mismatch_plot(
                    report["mismatch_curves"], {n: a.label for n, a in ARMS.items()},
                    f"preset {preset.name}, regime {args.regime}: training-inference mismatch of own rows "
                    "(mean ± std over seeds)")
            path = out.commit(files)[1]
            _log(f"report: {path}")
    if markdown is not None:
        print(markdown)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
