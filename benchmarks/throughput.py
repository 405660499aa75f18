"""Throughput against GSPO, in one command: GSPO, GSPO ×2, Naive and HACPO on the same agents, prompts and machine.

    python benchmarks/throughput.py                          # tiny preset "model", 2 rounds x 12 steps per arm
    python benchmarks/throughput.py --config three           # N = 3 (and HACPO at N = 2 for the step ratio)
    python benchmarks/throughput.py --config smollm2         # SmolLM2-135M-Instruct + a zoo agent, offline
    python benchmarks/throughput.py --config gpu --model a=/models/A --model b=/models/B [-- TRAINER FLAGS]
    python benchmarks/throughput.py --time_to_accuracy       # GSPO x2 and HACPO, 80 steps, evaluation every 10
    python benchmarks/throughput.py --report_only            # tables again from the runs on disk

Every run is one normal training command (the tiny main job, or ``train_hacpo`` itself; see
:mod:`throughput_setups`), launched as a subprocess. The runs are interleaved, arms in order then reversed in
alternate rounds (A B C D, D C B A, ...), so a change in the machine's speed hits every arm alike. Each run makes
``--steps`` steps; the first ``--warmup`` of each are dropped (and a one-step-off arm's last step, which generates
nothing). While a run is going, the summed resident (RSS) and
proportional (PSS) memory of its process tree (the command, Ray's processes and workers) is sampled with psutil;
its peak is the run's memory figure.

From the runs' ``metrics.jsonl`` (figures defined in :mod:`throughput_stats`) it writes
``benchmarks/results/throughput_<config>.{md,json,png}`` atomically: step seconds (median, quartiles) by phase,
rollouts/s, generated and trained tokens/s, rows and tokens through the backward pass, padding fractions, peak
memory, each as a ratio to GSPO, and per agent the median seconds of every phase the trainer logs. A run that fails
leaves those files as they were and writes its error to ``throughput_<config>.failed.md`` beside them.

``--time_to_accuracy`` (tiny presets): one longer run of GSPO ×2 and of HACPO (``--arms``: any arms, optional ones
included, with gspo2x among them) with periodic evaluation; for every
agent, the training seconds (Σ time/step) until HACPO first reaches the final accuracy of GSPO ×2 (mean of its
last two evaluations), against GSPO ×2's own; written to ``throughput_<config>_accuracy.{md,json,png}``.

Trainer flags after ``--`` go to every run (e.g. ``-- --micro_train_batch_size 32``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, _p)

from throughput_report import format_accuracy, format_report, plot_accuracy, plot_report  # noqa: E402
from throughput_setups import ARMS, BASELINE, CONFIGS, OPTIONAL_ARMS, Setup, interleave, make_setup, parse_models  # noqa: E402
from throughput_stats import arm_ratios, summarize_agents, summarize_arm, time_to_reach  # noqa: E402

from results_io import ResultWriter  # noqa: E402

from openrlhf_hacpo.utils.atomic import atomic_write_json  # noqa: E402
from openrlhf_hacpo.utils.jsonl import read_records  # noqa: E402
from openrlhf_hacpo.utils.options import split_passthrough  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
FACTS_SUFFIX = ".json"
"""Each run ``<arm>/round<r>`` has ``<arm>/round<r>.json`` beside it (command, status, seconds, peak memory) and
``<arm>/round<r>.log`` (its output)."""
GIB = float(1 << 30)


def _log(message: str) -> None:
    print(f"[throughput {datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------- memory
class TreeMemory:
    """Samples, every ``interval`` seconds, the summed RSS and PSS of a process and all its descendants; keeps the
    peaks (bytes) and the most processes seen at once. Without psutil, every figure stays ``None``."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.peak_rss: int | None = None
        self.peak_pss: int | None = None
        self.peak_process_rss: int | None = None
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, psutil) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        rss = pss = 0
        largest = 0
        for p in procs:
            try:
                info = p.memory_full_info()
            except psutil.Error:
                try:
                    info = p.memory_info()
                except psutil.Error:
                    continue
            rss += info.rss
            largest = max(largest, info.rss)
            pss += getattr(info, "pss", info.rss)
        self.peak_rss = max(self.peak_rss or 0, rss)
        self.peak_pss = max(self.peak_pss or 0, pss)
        self.peak_process_rss = max(self.peak_process_rss or 0, largest)
        self.processes = max(self.processes, len(procs))

    def _loop(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        while not self._stop.is_set():
            self._sample(psutil)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------------------------------------------- running
def run_dir(root: Path, arm: str, rnd: int) -> Path:
    return root / arm / f"round{rnd}"


def _fresh(output: Path) -> None:
    """Remove an earlier run of this benchmark at ``output`` (one with its facts file beside it)."""
    if output.exists():
        if not (output.parent / f"{output.name}{FACTS_SUFFIX}").is_file() and any(output.iterdir()):
            raise ValueError(f"{output} is not empty and no run of this benchmark wrote it; use another --runs_dir")
        shutil.rmtree(output)
    output.parent.mkdir(parents=True, exist_ok=True)


def run_one(cmd: Sequence[str], output: Path, env: dict[str, str], label: str) -> dict[str, Any]:
    """Run one command with its output in ``<output>.log``, sampling its memory; writes and returns its facts."""
    _fresh(output)
    facts_path = output.parent / f"{output.name}{FACTS_SUFFIX}"
    log_path = output.parent / f"{output.name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        with TreeMemory(proc.pid) as mem:
            status = proc.wait()
    seconds = time.perf_counter() - t0
    facts = {"label": label, "command": shlex.join(cmd), "status": status, "wall_seconds": seconds,
             "peak_rss_gib": mem.peak_rss / GIB if mem.peak_rss else None,
             "peak_pss_gib": mem.peak_pss / GIB if mem.peak_pss else None,
             "peak_process_rss_gib": mem.peak_process_rss / GIB if mem.peak_process_rss else None,
             "processes": mem.processes, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(facts_path, facts)
    if status != 0:
        raise RuntimeError(f"{label} failed with status {status} after {seconds:.0f} s; its output is in {log_path}")
    return facts


def run_order(setup: Setup, order: Sequence[tuple[int, str]], root: Path, *, seed: int, steps: int,
              eval_steps: int | None, extra: Sequence[str]) -> None:
    from openrlhf_hacpo.zoo.job import trainer_env

    env = trainer_env()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for i, (rnd, name) in enumerate(order, 1):
        out = run_dir(root, name, rnd)
        cmd = setup.command(ARMS[name], seed=seed, steps=steps, output=out, eval_steps=eval_steps, extra=extra)
        _log(f"run {i}/{len(order)}: {name} round {rnd}: {shlex.join(cmd[1:])}")
        facts = run_one(cmd, out, env, f"{name} round {rnd}")
        rss = facts["peak_rss_gib"]
        _log(f"  done in {facts['wall_seconds']:.0f} s" + (f", peak RSS {rss:.2f} GiB" if rss else ""))


# ---------------------------------------------------------------------------------------------------------- reports
def _machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    text = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    return text + (f", load average {load[0]:.1f} when the report was made" if load else "")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "openrlhf_hacpo", "kernels"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes in openrlhf_hacpo/ or kernels/" if dirty else "")


def _load_run(root: Path, name: str, rnd: int) -> tuple[list[dict], dict]:
    out = run_dir(root, name, rnd)
    facts_path = out.parent / f"{out.name}{FACTS_SUFFIX}"
    if not facts_path.is_file():
        raise FileNotFoundError(f"{name} round {rnd}: no run at {out} (no {facts_path.name}); run the benchmark "
                                "without --report_only")
    import json

    facts = json.loads(facts_path.read_text(encoding="utf-8"))
    if facts.get("status") != 0:
        raise RuntimeError(f"{name} round {rnd} failed (status {facts.get('status')}); see {out}.log")
    return read_records(out / "metrics.jsonl"), facts


def _measured_records(arm: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's records that measure its steps: all of them, except that a one-step-off arm's last step is left out
    (it generates nothing, so it is shorter than the steady state the arm is measured for)."""
    if "--one_step_off" not in ARMS[arm].flags or not records:
        return list(records)
    last = max(r["step"] for r in records)
    return [r for r in records if r["step"] != last]


def _max_or_none(values: Sequence[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def build_payload(setup: Setup, order: Sequence[tuple[int, str]], root: Path, *, steps: int, warmup: int,
                  rounds: int, command: str) -> dict[str, Any]:
    """The report of the runs on disk: per arm its summary, per-agent phases, peak memory and ratios to GSPO."""
    arms: dict[str, Any] = {}
    for name in dict.fromkeys(a for _, a in order):
        loaded = [_load_run(root, name, r) for r, a in order if a == name]
        runs = [_measured_records(name, records) for records, _ in loaded]
        summary = summarize_arm(runs, warmup)
        for key in ("peak_rss_gib", "peak_pss_gib", "peak_process_rss_gib"):
            summary[key] = _max_or_none([facts.get(key) for _, facts in loaded])
        summary["wall_seconds"] = [facts["wall_seconds"] for _, facts in loaded]
        summary["run_medians"] = [summarize_arm([records], warmup)["step_s"]["median"] for records in runs]
        summary["agents"] = summarize_agents(runs, warmup)
        summary["label"] = ARMS[name].label
        arms[name] = summary
    if BASELINE not in arms:
        raise ValueError(f"the arms must include {BASELINE!r}, the baseline of every ratio")
    for summary in arms.values():
        summary["ratios"] = arm_ratios(summary, arms[BASELINE])
    notes = []
    if "hacpo" in arms and "hacpo-n2" in arms:
        ratio = arms["hacpo"]["step_s"]["median"] / arms["hacpo-n2"]["step_s"]["median"]
        notes.append(f"HACPO step with N = 3 agents / N = 2 (same machine, interleaved): **{ratio:.3f}**.")
    if "hacpo" in arms and arms["hacpo"]["ratios"].get("step_s.median") is not None:
        notes.append(f"HACPO step / GSPO step (equal rollouts per agent): **{arms['hacpo']['ratios']['step_s.median']:.3f}**"
                     + (f"; HACPO step / GSPO ×2 step (equal trained rows): **"
                        f"{arms['hacpo']['step_s']['median'] / arms['gspo2x']['step_s']['median']:.3f}**"
                        if "gspo2x" in arms else "") + ".")
    for name in ("gspo", "naive", "hacpo"):  # the scoring saving: steps/s with it over steps/s without
        if name in arms and f"{name}-from-update" in arms:
            ratio = arms[name]["step_s"]["median"] / arms[f"{name}-from-update"]["step_s"]["median"]
            notes.append(f"{ARMS[name].label}, old log-probs from the update (`--old_logp_from_update`): "
                         f"**{ratio:.3f}×** the steps/s without it (median step seconds).")
        if name in arms and f"{name}-overlap" in arms:  # generation overlapped with training
            ratio = arms[name]["step_s"]["median"] / arms[f"{name}-overlap"]["step_s"]["median"]
            notes.append(f"{ARMS[name].label}, one step off (`--one_step_off`): **{ratio:.3f}×** the steps/s of "
                         f"synchronous steps (median step seconds, same rollout backend).")
        if name in arms and f"{name}-no-mismatch" in arms:  # the engines' log-probs and the mismatch/* figures
            cost = arms[name]["step_s"]["median"] / arms[f"{name}-no-mismatch"]["step_s"]["median"] - 1
            notes.append(f"{ARMS[name].label}, the mismatch metrics' cost (on by default; `--no_mismatch_metrics` "
                         f"turns them off): **{100 * cost:+.1f}%** of the step (median step seconds, side by side).")
    return {"config": setup.name, "description": setup.description,
            "settings": {"steps": steps, "warmup": warmup, "rounds": rounds},
            "order": [list(o) for o in order], "command": command, "machine": _machine(), "commit": _commit(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "arms": arms, "notes": notes}


def accuracy_payload(setup: Setup, arms: Sequence[str], root: Path, reference: str, *, steps: int,
                     eval_steps: int, command: str) -> dict[str, Any]:
    """Time to accuracy from one run per arm (round 0): targets from ``reference``'s final accuracy."""
    from openrlhf_hacpo.zoo.reports import FINAL_EVALS, load_summary

    data = {}
    for name in arms:
        records, _ = _load_run(root, name, 0)
        summary = load_summary(run_dir(root, name, 0))
        if summary is None:
            raise FileNotFoundError(f"{name}: no summary.json in {run_dir(root, name, 0)} (did the run finish?)")
        step_s = {}
        for r in records:
            step_s[int(r["step"])] = max(step_s.get(int(r["step"]), 0.0), float(r["time/step"]))
        data[name] = (summary, step_s)
    targets = {agent: a["acc_final"] for agent, a in data[reference][0]["agents"].items()}
    out_arms: dict[str, Any] = {}
    for name, (summary, step_s) in data.items():
        reached, best, curves = {}, {}, {}
        for agent in targets:
            curve = [(int(s), float(a)) for s, a in summary["agents"][agent]["validation"]]
            reached[agent] = time_to_reach(curve, step_s, targets[agent])
            best[agent] = max(a for _, a in curve)
            curves[agent] = [[s, a, sum(step_s.get(t, 0.0) for t in range(1, s + 1))] for s, a in curve]
        out_arms[name] = {"label": ARMS[name].label, "reached": reached, "best": best, "curves": curves,
                          "train_seconds": sum(step_s.values())}
    ratios = {}
    for name in arms:
        ratios[name] = {}
        for agent in targets:
            mine, ref = out_arms[name]["reached"][agent], out_arms[reference]["reached"][agent]
            ratios[name][agent] = mine["seconds"] / ref["seconds"] if mine and ref and ref["seconds"] > 0 else None
    return {"config": setup.name, "description": setup.description, "reference": reference,
            "reference_label": ARMS[reference].label, "final_evals": FINAL_EVALS,
            "settings": {"steps": steps, "eval_steps": eval_steps}, "targets": targets, "arms": out_arms,
            "ratios": ratios, "command": command, "machine": _machine(), "commit": _commit(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def result_writer(stem: str, results_dir: Path, command: str) -> ResultWriter:
    """``<stem>.{json,md,png}`` replaced only by a run that finished; a failed one goes to ``<stem>.failed.md``."""
    return ResultWriter(stem, results_dir, command=command, name="throughput")


def write_results(out: ResultWriter, payload: dict[str, Any], markdown: str, png: bytes) -> None:
    out.commit({".json": payload, ".md": markdown, ".png": png})
    _log(f"wrote {out.results_dir / out.stem}.md, .json and .png")


# ---------------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/throughput.py", description=__doc__.split("\n\n")[0],
                                epilog="Trainer flags after '--' go to every run.")
    p.add_argument("--config", default="model", choices=CONFIGS, help="what to compare on [model]")
    p.add_argument("--steps", type=int, default=None, help="steps per run [model/three/gpu: 12, smollm2: 3; "
                   "--time_to_accuracy: the preset's 80]")
    p.add_argument("--warmup", type=int, default=None, help="first steps of each run left out [2; smollm2: 1]")
    p.add_argument("--rounds", type=int, default=None, help="runs per arm, interleaved [2; smollm2: 1]")
    p.add_argument("--arms", default=None, help="comma-separated subset of the configuration's arms "
                   "(gspo, gspo2x, naive, hacpo; three also hacpo-n2) and of the optional arms with "
                   "--old_logp_from_update (gspo-from-update, naive-from-update, hacpo-from-update) or "
                   "--one_step_off (gspo-overlap, naive-overlap, hacpo-overlap; engine actors: on model, three and "
                   "smollm2 add '-- --rollout_backend hf_engine'); must include gspo")
    p.add_argument("--seed", type=int, default=0, help="seed of every run (the same prompts in every arm)")
    p.add_argument("--runs_dir", type=Path, default=None, help="run folders [<runs>/throughput/<config>]")
    p.add_argument("--results_dir", type=Path, default=RESULTS_DIR, help="where the tables go [benchmarks/results]")
    p.add_argument("--report_only", action="store_true", help="tables from the runs on disk, no new run")
    p.add_argument("--time_to_accuracy", action="store_true",
                   help="tiny presets: GSPO x2 and HACPO with periodic evaluation, time to GSPO x2's final accuracy")
    p.add_argument("--eval_steps", type=int, default=None, help="--time_to_accuracy: evaluate every N steps [10]")
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH", help="--config gpu: an agent")
    p.add_argument("--prompt_data", type=Path, default=None,
                   help="--config gpu: prompt jsonl (input/label) [the tiny task's 3-digit additions]")
    p.add_argument("--zoo_agent", default="llamaS", help="--config smollm2: the zoo agent beside SmolLM2 [llamaS]")
    p.add_argument("--rollout_backend", choices=("hf", "vllm"), default=None,
                   help="smollm2 / gpu: rollout engine [smollm2: hf, gpu: vllm]")
    p.add_argument("--generate_max_len", type=int, default=None, help="smollm2 / gpu: new tokens [32 / 1024]")
    return p


def _positive(name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"--{name} must be >= {minimum}, got {value}")


def main(argv: Sequence[str] | None = None) -> int:
    argv, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = "python benchmarks/throughput.py " + shlex.join(list(argv) + (["--", *extra] if extra else []))
    try:
        for name in ("steps", "rounds", "eval_steps"):
            _positive(name, getattr(args, name))
        _positive("warmup", args.warmup, 0)
        setup = make_setup(args.config, models=parse_models(args.model), prompt_data=args.prompt_data,
                           zoo_agent=args.zoo_agent, rollout_backend=args.rollout_backend,
                           generate_max_len=args.generate_max_len)
        root = args.runs_dir
        if root is None:
            from openrlhf_hacpo.zoo.job import default_runs_dir

            root = default_runs_dir() / "throughput" / (setup.name + ("-accuracy" if args.time_to_accuracy else ""))
        if args.time_to_accuracy:
            return _time_to_accuracy(args, setup, root, extra, command)
        arms = setup.arms if args.arms is None else tuple(a.strip() for a in args.arms.split(",") if a.strip())
        unknown = [a for a in arms if a not in setup.arms + OPTIONAL_ARMS]
        if unknown:
            raise ValueError(f"--arms {','.join(unknown)}: not arms of --config {setup.name} "
                             f"({', '.join(setup.arms + OPTIONAL_ARMS)})")
        if BASELINE not in arms:
            raise ValueError(f"--arms must include {BASELINE}, the baseline of every ratio")
        steps = args.steps or setup.steps
        warmup = setup.warmup if args.warmup is None else args.warmup
        rounds = args.rounds or setup.rounds
        if warmup >= steps:
            raise ValueError(f"--warmup {warmup} leaves no measured step of --steps {steps}")
        if warmup >= steps - 1 and any("--one_step_off" in ARMS[a].flags for a in arms):
            raise ValueError(f"--warmup {warmup} and --steps {steps} leave no measured step of the one-step-off "
                             "arms, whose last step (no generation) is left out too: give --steps >= warmup + 2")
        order = interleave(arms, rounds)
        with result_writer(f"throughput_{setup.name}", args.results_dir, command) as out:
            if not args.report_only:
                setup.prepare()
                _log(f"{setup.description}: {len(order)} runs of {steps} steps, order "
                     f"{' '.join(a for _, a in order)}; run folders under {root}")
                run_order(setup, order, root, seed=args.seed, steps=steps, eval_steps=None, extra=extra)
            payload = build_payload(setup, order, root, steps=steps, warmup=warmup, rounds=rounds, command=command)
            markdown = format_report(payload)
            write_results(out, payload, markdown, plot_report(payload))
        print(markdown)
        return 0
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as err:
        print(f"throughput: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"throughput: {err}", file=sys.stderr)
        return 1


def _time_to_accuracy(args: argparse.Namespace, setup: Setup, root: Path, extra: Sequence[str], command: str) -> int:
    if setup.tiny_preset is None:
        raise ValueError(f"--time_to_accuracy runs on the tiny presets (model, three), not --config {setup.name}")
    from openrlhf_hacpo.zoo import get_preset

    rl = get_preset(setup.tiny_preset).rl
    arms = ("gspo2x", "hacpo") if args.arms is None else tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = [a for a in arms if a not in setup.arms + OPTIONAL_ARMS]
    if unknown or "gspo2x" not in arms:
        raise ValueError(f"--time_to_accuracy --arms must include gspo2x and be arms of --config {setup.name} "
                         f"({', '.join(setup.arms + OPTIONAL_ARMS)}), got {','.join(arms)}")
    steps, eval_steps = args.steps or rl.num_steps, args.eval_steps or rl.eval_every
    if args.rounds not in (None, 1):
        raise ValueError("--time_to_accuracy makes one run per arm; leave --rounds out")
    order = interleave(arms, 1)
    with result_writer(f"throughput_{setup.name}_accuracy", args.results_dir, command) as out:
        if not args.report_only:
            setup.prepare()
            _log(f"time to accuracy, {setup.description}: {', '.join(arms)}, {steps} steps, evaluation every "
                 f"{eval_steps}; run folders under {root}")
            run_order(setup, order, root, seed=args.seed, steps=steps, eval_steps=eval_steps, extra=extra)
        payload = accuracy_payload(setup, arms, root, "gspo2x", steps=steps, eval_steps=eval_steps, command=command)
        markdown = format_accuracy(payload)
        write_results(out, payload, markdown, plot_accuracy(payload))
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
