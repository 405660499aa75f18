"""The training path end to end on one device, without Ray or vLLM: what `benchmarks/gpu_train_check.sh` runs.

Two tiny random agents with heads of 32 (a Llama with the zoo's character tokenizer on DeepSpeed ZeRO-2, a Qwen3
with the zoo's byte-level BPE tokenizer on ZeRO-3) train together with HACPO through the command line
(``--no_ray --rollout_backend hf``): bf16, gradient checkpointing, a KL reference model, the fused log-probs and
(on CUDA) the Triton loss inside real DeepSpeed updates, greedy evaluation after every step, a joint checkpoint after
every step and the HF export at the end. Then:

* **resume**: a second run starts from the step-2 checkpoint of the first (``--resume``) and trains step 3 again;
  its step-3 metrics and evaluation must equal the uninterrupted run's to the printed tolerance, and so must its
  exported weights;
* **export**: both HF exports reload with ``from_pretrained`` and give finite logits, and differ from the
  initial weights (the updates moved them).
* **memory options**: one step each with both agents on ZeRO-2 + ``adam_offload`` and on ZeRO-3 + ``param_offload`` +
  ``adam_offload`` (DeepSpeed's CPU Adam; docs/gpu.md, Memory options).

The reward scores a response by the parity of its length (as the trainer tests do), so random models get mixed
rewards and non-zero advantages. Prints a short report and writes it (atomically) to ``--report`` when every check
passed, else beside it to ``<report>.failed.md`` (the previous report stays). Exit status 0 when every check
passed.

    python benchmarks/gpu_train_check.py --device cuda      # usually through benchmarks/gpu_train_check.sh
    python benchmarks/gpu_train_check.py --device cpu --report runs/check.md
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENTS = {  # name: (family, tokenizer kind, ZeRO stage, init seed)
    "llama": ("llama", "char", 2, 1),
    "qwen": ("qwen3", "bpe", 3, 2),
}
STEPS = 3
RESUME_FROM = 2
OFFLOAD_CONFIGURATIONS = {  # name: (ZeRO stage of both agents, their memory settings), one step each
    "ZeRO-2 + adam_offload": (2, "adam_offload=true"),
    "ZeRO-3 + param_offload + adam_offload": (3, "param_offload=true,adam_offload=true"),
}
REWARD_FILE = '''
def reward_func(queries, prompts, labels):
    """1.0 when the response (query minus prompt) has an even number of characters."""
    return [float((len(q) - len(p)) % 2 == 0) for q, p in zip(queries, prompts)]
'''
NOT_COMPARED = ("time/",)
"""Metric name prefixes left out of the resume comparison (wall-clock times; throughputs end in ``_per_s``)."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class MemoryRow:
    """The memory plan's estimate of an agent's policy tensors on its GPU 0 beside what the run measured."""

    configuration: str
    agent: str
    estimate_gib: float
    measured_gib: float | None


@dataclass
class Report:
    device: str
    checks: list[Check] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    memory: list[MemoryRow] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        print(f"[gpu_train_check] {name}: {'ok' if ok else 'FAILED'} ({detail})", flush=True)
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


# ---------------------------------------------------------------------------------------------------- inputs
def build_inputs(root: Path) -> dict[str, Path]:
    """The two agents (random weights, heads of 32), train / eval prompts and the reward file under ``root``."""
    from openrlhf_hacpo.data.arithmetic import Problem, to_record
    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    paths: dict[str, Path] = {}
    for name, (family, kind, _, seed) in AGENTS.items():
        tokenizer = build_tokenizer(kind)
        spec = ModelSpec(family=family, hidden_size=64, num_layers=2, num_heads=2, head_dim=32, num_kv_heads=1,
                         intermediate_size=128, max_position_embeddings=256)
        model = build_model(spec, tokenizer, seed=seed)
        paths[name] = root / "agents" / name
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    pairs = [(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (6, 3), (4, 4), (8, 0), (9, 9), (2, 7), (5, 5), (0, 6)]
    records = [to_record(Problem(1, pair), f"p{i}") for i, pair in enumerate(pairs)]
    for split, rows in (("train", records), ("eval", records[:4])):
        paths[split] = root / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["reward"] = root / "parity_reward.py"
    paths["reward"].write_text(REWARD_FILE)
    return paths


def train_flags(inputs: dict[str, Path], save_path: Path, device: str, bf16: bool) -> list[str]:
    agents = []
    for name, (_, _, stage, _) in AGENTS.items():
        agents += ["--agent", f"name={name},pretrain={inputs[name]},zero_stage={stage}"]
    return [*agents,
            "--prompt_data", str(inputs["train"]), "--apply_chat_template", "--reward_fn", str(inputs["reward"]),
            "--reward_num_workers", "0", "--eval_data", str(inputs["eval"]), "--eval_steps", "1",
            "--n_samples_per_prompt", "4", "--rollout_batch_size", "4", "--train_batch_size", "16",
            "--micro_train_batch_size", "8", "--prompt_max_len", "64", "--generate_max_len", "16",
            "--actor_learning_rate", "1e-3", "--init_kl_coef", "0.01", "--gradient_checkpointing",
            *(["--bf16"] if bf16 else []), "--no_ray", "--device", device, "--rollout_backend", "hf",
            "--max_steps", str(STEPS), "--save_steps", "1", "--max_ckpt_num", str(STEPS), "--seed", "3",
            "--save_path", str(save_path), "--no_progress_bar"]


def run_trainer(flags: list[str], log: Path) -> tuple[int, float]:
    """One training command in its own process; its output goes to ``log``. Returns (exit status, seconds)."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        # the same interpreter as this one, with the same view of the packages (-S: no site-packages)
        python = [sys.executable, *(["-S"] if sys.flags.no_site else [])]
        done = subprocess.run([*python, "-m", "openrlhf_hacpo.cli.train_hacpo", *flags], stdout=out,
                              stderr=subprocess.STDOUT, cwd=REPO)
    return done.returncode, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------- comparisons
def _records(path: Path) -> dict[tuple[int, str], dict]:
    from openrlhf_hacpo.utils.jsonl import read_records

    return {(int(r["step"]), str(r.get("agent"))): r for r in read_records(path)}


def _numbers(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith(NOT_COMPARED)
            and not k.endswith("_per_s")}


def compare_records(a: dict, b: dict) -> tuple[float, str]:
    """Largest |a - b| / max(1, |a|) over the numeric metrics both records hold, and where: the metric it is on
    and how many metrics were compared."""
    worst, where = 0.0, "-"
    na, nb = _numbers(a), _numbers(b)
    for key in sorted(set(na) & set(nb)):
        x, y = na[key], nb[key]
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y) / max(1.0, abs(x)) if math.isfinite(x) and math.isfinite(y) else math.inf
        if diff > worst:
            worst, where = diff, key
    missing = sorted(set(na) ^ set(nb))
    if missing:
        return math.inf, f"metrics only in one run: {missing[:5]}"
    return worst, f"{where}; {len(na)} metrics compared"


def load_export(path: Path):
    """An HF export reloaded as float32 with its tokenizer; raises when it does not load."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


def weight_diff(a, b) -> float:
    pb = dict(b.named_parameters())
    return max(float((p.detach() - pb[n].detach()).abs().max()) for n, p in a.named_parameters())


# ---------------------------------------------------------------------------------------------------- the check
def check_straight_run(report: Report, run: Path) -> tuple[dict, dict]:
    """What the uninterrupted run left: every step's metrics and evaluation for both agents, two optimizer updates
    per step, a checkpoint per step. Returns its metrics and evaluation records by (step, agent)."""
    metrics = _records(run / "metrics.jsonl")
    steps = sorted({s for s, _ in metrics})
    agents = sorted({a for _, a in metrics})
    report.add("metrics", steps == list(range(1, STEPS + 1)) and agents == sorted(AGENTS),
               f"steps {steps}, agents {agents}")
    updates = [metrics.get((STEPS, a), {}).get("updates") for a in sorted(AGENTS)]
    report.add("updates", all(isinstance(u, (int, float)) and u >= 2 for u in updates),
               f"optimizer updates in step {STEPS}: {updates} (2 expected per agent)")
    evals = _records(run / "eval.jsonl")
    report.add("evaluation", sorted({s for s, _ in evals}) == list(range(1, STEPS + 1)),
               f"eval.jsonl steps {sorted({s for s, _ in evals})}")
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("global_step*"))
    report.add("checkpoints", checkpoints == [f"global_step{s}" for s in range(1, STEPS + 1)], f"{checkpoints}")
    return metrics, evals


def check_resumed_run(report: Report, run: Path, metrics: dict, evals: dict, tolerance: float) -> None:
    """The resumed run logged only step 3, and its metrics and evaluation equal the uninterrupted run's."""
    again, eval_again = _records(run / "metrics.jsonl"), _records(run / "eval.jsonl")
    report.add("resumed steps", sorted(again) == [(STEPS, a) for a in sorted(AGENTS)], f"{sorted(again)}")
    for agent in sorted(AGENTS):
        key = (STEPS, agent)
        if key in again and key in metrics:
            diff, where = compare_records(metrics[key], again[key])
            report.add(f"resume = uninterrupted ({agent})", diff <= tolerance,
                       f"step {STEPS} metrics: max relative difference {diff:.3g} (at {where}); tolerance "
                       f"{tolerance:g}")
        if key in evals and key in eval_again:
            diff, where = compare_records(evals[key], eval_again[key])
            report.add(f"resumed evaluation ({agent})", diff <= tolerance,
                       f"step {STEPS} evaluation: max relative difference {diff:.3g} (at {where})")


def check_exports(report: Report, straight: Path, resumed: Path, inputs: dict[str, Path], tolerance: float) -> None:
    """Both runs' HF exports reload, give finite logits, moved away from the initial weights and agree."""
    import torch

    for agent in sorted(AGENTS):
        try:
            model, tokenizer = load_export(straight / "hf" / agent)
            other, _ = load_export(resumed / "hf" / agent)
            initial, _ = load_export(inputs[agent])
        except Exception as err:  # noqa: BLE001 - reported as the check's failure
            report.add(f"HF export ({agent})", False, f"{type(err).__name__}: {err}")
            continue
        ids = torch.tensor([tokenizer("Q: 2+7=?")["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        moved, across = weight_diff(model, initial), weight_diff(model, other)
        report.add(f"HF export ({agent})", bool(torch.isfinite(logits).all()) and moved > 0 and across <= tolerance,
                   f"reloads, finite logits {tuple(logits.shape)}; largest change from the initial weights "
                   f"{moved:.3g}; largest difference straight vs resumed {across:.3g}")


def record_memory(report: Report, configuration: str, flags: list[str], run: Path) -> None:
    """Add the memory plan's estimate of each agent's policy tensors on its GPU 0 and the largest
    ``perf/cuda_max_allocated_gib`` its workers logged (none on CPU); without Ray also the agents' sum."""
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.memory_layout import agent_layouts
    from openrlhf_hacpo.trainer.memory_plan import plan_run
    from openrlhf_hacpo.trainer.preflight import load_model_configs

    cfg = build_config(flags)
    layouts = agent_layouts(cfg, plan_agents(cfg, on_gpu=True), load_model_configs(cfg))
    plan = plan_run(layouts, None, shared_gpu=not cfg.cluster.use_ray)
    metrics = _records(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else {}
    rows = []
    for agent in cfg.agent_names:
        peaks = [float(r["perf/cuda_max_allocated_gib"]) for (_, name), r in metrics.items()
                 if name == agent and isinstance(r.get("perf/cuda_max_allocated_gib"), (int, float))]
        estimate = next(r.allocated for r in plan.rows if r.agent == agent and r.gpu == 0)
        rows.append(MemoryRow(configuration, agent, estimate / 2**30, max(peaks) if peaks else None))
    if plan.shared_gpu and len(rows) > 1:
        measured = [m.measured_gib for m in rows if m.measured_gib is not None]
        rows.append(MemoryRow(configuration, "all (one process)", sum(m.estimate_gib for m in rows),
                              max(measured) if measured else None))
    report.memory += rows
    for m in rows:
        print(f"[gpu_train_check] memory {configuration} / {m.agent}: plan {m.estimate_gib:.3f} GiB, measured "
              f"{'-' if m.measured_gib is None else f'{m.measured_gib:.3f}'} GiB", flush=True)


def check_lora(report: Report, inputs: dict[str, Path], out: Path, device: str, bf16: bool) -> None:
    """When peft imports: both agents with a rank-8 LoRA adapter on every linear layer train one step and log their
    metrics, and their memory goes beside the plan's estimate."""
    if importlib.util.find_spec("peft") is None:
        print("[gpu_train_check] LoRA configuration skipped: peft does not import", flush=True)
        return
    run = out / "lora"
    flags = [*train_flags(inputs, run, device, bf16), "--lora_rank", "8", "--max_steps", "1"]
    if _trained(report, "LoRA", flags, out / "lora.log", "1 step with --lora_rank 8"):
        metrics = _records(run / "metrics.jsonl")
        report.add("LoRA metrics", sorted(metrics) == [(1, a) for a in sorted(AGENTS)], f"{sorted(metrics)}")
        record_memory(report, "LoRA r=8 pair", flags, run)


def check_offload(report: Report, inputs: dict[str, Path], out: Path, device: str, bf16: bool) -> None:
    """Both agents under each of :data:`OFFLOAD_CONFIGURATIONS` (optimizer states and the Adam update on the CPU,
    and with ZeRO-3 the parameters too) train one step and log their metrics; their memory goes beside the plan's
    estimate. The first one builds DeepSpeed's ``cpu_adam`` op unless it is in ``TORCH_EXTENSIONS_DIR``."""
    for name, (stage, settings) in OFFLOAD_CONFIGURATIONS.items():
        slug = name.lower().replace(" + ", "_").replace("-", "")
        run = out / slug
        flags = train_flags(inputs, run, device, bf16) + ["--max_steps", "1"]
        flags = [f"{re.sub(r'zero_stage=[0-3]', f'zero_stage={stage}', flag)},{settings}"
                 if i and flags[i - 1] == "--agent" else flag for i, flag in enumerate(flags)]
        if _trained(report, name, flags, out / f"{slug}.log", f"1 step with {name}"):
            metrics = _records(run / "metrics.jsonl")
            report.add(f"{name} metrics", sorted(metrics) == [(1, a) for a in sorted(AGENTS)], f"{sorted(metrics)}")
            record_memory(report, name, flags, run)


def _trained(report: Report, name: str, flags: list[str], log: Path, what: str) -> bool:
    rc, report.seconds[what] = run_trainer(flags, log)
    if not report.add(name, rc == 0, f"{what}, exit {rc}; log {log}"):
        print(log.read_text()[-4000:], file=sys.stderr)
        return False
    return True


def check(device: str, out: Path, bf16: bool, tolerance: float, offload: bool = True) -> Report:
    """Build the inputs, run both trainings and every check under ``out`` (emptied first); ``offload=False`` leaves
    out :data:`OFFLOAD_CONFIGURATIONS`."""
    report = Report(device)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    inputs = build_inputs(out)
    report.seconds["build agents"] = time.perf_counter() - t0

    straight, resumed = out / "straight", out / "resumed"
    if not _trained(report, "train", train_flags(inputs, straight, device, bf16), out / "straight.log",
                    f"train {STEPS} steps"):
        return report
    metrics, evals = check_straight_run(report, straight)
    record_memory(report, "ZeRO-2 + ZeRO-3 pair", train_flags(inputs, straight, device, bf16), straight)
    # a second run from the step-2 checkpoint trains step 3 again
    source = straight / "checkpoints" / f"global_step{RESUME_FROM}"
    shutil.copytree(source, resumed / "checkpoints" / source.name)
    (resumed / "checkpoints" / "latest").write_text(f"{source.name}\n")
    if not _trained(report, "resume", [*train_flags(inputs, resumed, device, bf16), "--resume"],
                    out / "resumed.log", f"--resume from step {RESUME_FROM} + 1 step"):
        return report
    check_resumed_run(report, resumed, metrics, evals, tolerance)
    check_exports(report, straight, resumed, inputs, tolerance)
    check_lora(report, inputs, out, device, bf16)
    if offload:
        check_offload(report, inputs, out, device, bf16)
    return report


# ---------------------------------------------------------------------------------------------------- report
def environment() -> str:
    import torch
    import transformers

    parts = [f"python {platform.python_version()}", f"torch {torch.__version__}",
             f"transformers {transformers.__version__}"]
    try:
        import triton

        parts.append(f"triton {triton.__version__}")
    except ImportError:
        parts.append("no triton")
    import deepspeed

    carried = os.environ.get("HACPO_GPU_DEPS_USED")  # set by gpu_train_check.sh when it appended the folder
    parts.append(f"deepspeed {deepspeed.__version__} ({'carried folder ' + carried if carried else 'installed'})")
    parts.append(torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")
    return " | ".join(parts)


def render(report: Report, command: str, env: str, total_s: float) -> str:
    lines = ["# GPU train check" if report.device == "cuda" else "# GPU train check, run on CPU", "",
             f"Command: `{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "", env, "",
             "Two tiny random agents (heads of 32): Llama + char tokenizer on ZeRO-2, Qwen3 + BPE on ZeRO-3; "
             f"`--no_ray --device {report.device} --rollout_backend hf`, HACPO, gradient checkpointing, KL reference, "
             f"evaluation and a checkpoint every step, {STEPS} steps; then `--resume` from step {RESUME_FROM}.", "",
             "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.detail} |" for c in report.checks]
    if report.memory:
        lines += ["", "Memory: the plan's estimate of each agent's policy tensors "
                  "(`openrlhf_hacpo/trainer/memory_plan.py`, without allocator overhead and CUDA context) beside `torch.cuda.max_memory_allocated` as the run "
                  "logged it (`perf/cuda_max_allocated_gib`, max over steps; without Ray both agents share the "
                  "process, so each logs its peak, to compare with the sum).", "",
                  "| configuration | agent | plan estimate (GiB) | measured max_memory_allocated (GiB) |",
                  "|---|---|---|---|"]
        lines += [f"| {m.configuration} | {m.agent} | {m.estimate_gib:.3f} | "
                  f"{'-' if m.measured_gib is None else f'{m.measured_gib:.3f}'} |" for m in report.memory]
    lines += ["", "| phase | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in report.seconds.items()]
    lines += [f"| total | {total_s:.1f} |", "", f"Result: {'all checks passed' if report.ok else 'FAILED'}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_train_check",
                        help="folder for the agents and both runs (emptied first)")
    parser.add_argument("--report", type=Path, default=None,
                        help="report file (default benchmarks/results/gpu_train_check.md on cuda, "
                             "OUT/gpu_train_check_cpu.md on cpu)")
    parser.add_argument("--fp32", action="store_true", help="train in fp32 instead of bf16")
    parser.add_argument("--no_offload", action="store_true",
                        help="leave out the offload configurations (on a CPU their first run compiles DeepSpeed's "
                             "cpu_adam op; tests/gpu_stack/test_offload.py checks them on CPU)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative difference accepted between the resumed and the uninterrupted run "
                             "(default 1e-6 on CPU, which is deterministic; 1e-3 on CUDA)")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("[gpu_train_check] --device cuda: no CUDA device is visible", file=sys.stderr)
        return 2
    tolerance = args.tolerance if args.tolerance is not None else (1e-3 if args.device == "cuda" else 1e-6)
    report_path = args.report or (REPO / "benchmarks" / "results" / "gpu_train_check.md" if args.device == "cuda"
                                  else args.out / "gpu_train_check_cpu.md")
    command = "bash benchmarks/gpu_train_check.sh " + " ".join(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from results_io import ResultWriter

    # the report replaces the one at report_path only when every check passed; otherwise it goes beside it, to
    # <report>.failed.md (and an exception's traceback with it)
    t0 = time.perf_counter()
    with ResultWriter(report_path.stem, report_path.parent, command=command, name="gpu_train_check") as out:
        report = check(args.device, args.out.resolve(), bf16=not args.fp32, tolerance=tolerance,
                       offload=not args.no_offload)
        text = render(report, command, environment(), time.perf_counter() - t0)
        if report.ok:
            out.commit({report_path.suffix or ".md": text})
        else:
            report_path = out.fail("failed checks: " + ", ".join(c.name for c in report.checks if not c.ok)
                                   if report.checks else "no check ran", partial=text)
    print(text)
    print(f"[gpu_train_check] report: {report_path}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
