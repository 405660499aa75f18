"""Step-level benchmark: response log-probs through the full logits vs the fused linear path.

For two models it measures one **scoring pass** (no grad: :func:`response_logprobs` on a padded batch, as old-log-prob
and reference scoring run it) and one **update micro-batch** (forward with entropy, :func:`hacpo_loss` with KL on
and half the rows foreign, backward), each with ``path="logits"`` and ``path="fused"``:

* ``large_vocab``: a Qwen3 model with hidden 1024, 2 layers and a 151,936-token vocabulary (tied embeddings,
  random weights built with ``from_config``, no download);
* ``zoo``: the zoo's ``qwenM`` agent (byte-level BPE tokenizer, :mod:`openrlhf_hacpo.zoo`).

On CPU every measurement runs in a fresh child process so that its peak resident set is clean (on CUDA the
allocator's peak counter is reset instead, in one process). Seconds are the median of the repetitions; peak memory
is, on CPU, the peak resident set (VmHWM) above the resident set once the model, the batch and (update) the
parameter gradients exist, and on CUDA ``torch.cuda.max_memory_allocated`` above the same baseline. The parameter
gradients are allocated before the baseline is taken, as an optimizer's gradient buffers are in steady state.
Results go to ``benchmarks/results/step_<device>.{json,md}`` (atomically), with ratios fused/logits and, on CPU,
the issue's targets at vocabulary 151,936 (scoring peak <= 25%, update peak <= 50%, time <= 1.1x).

    python benchmarks/bench_step.py --quick        # CPU: fp32, 4096 response tokens, 1 repetition
    python benchmarks/bench_step.py                # GPU: bf16, 8192 response tokens, 5 repetitions
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for entry in (ROOT, ROOT / "benchmarks"):
    if str(entry) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(entry))

from bench_kernels import MIB, _pin_malloc_to_mmap, _reset_peak_rss, _status_kib  # noqa: E402
from results_io import RESULTS_DIR, ResultWriter, run_facts  # noqa: E402

MODELS = ("large_vocab", "zoo")
PASSES = ("score", "update")
PATHS = ("logits", "fused")
CPU_TARGETS = {"score": 0.25, "update": 0.50}
"""Peak-memory ratio fused/logits the fused path must reach on CPU at vocabulary 151,936 (time: <= 1.1x)."""
TIME_TARGET = 1.1
LARGE_VOCAB = 151936


@dataclass(frozen=True)
class Shape:
    """``rows`` sequences of ``prompt`` + ``response`` tokens (every response at full length)."""

    rows: int
    prompt: int
    response: int

    @property
    def tokens(self) -> int:
        return self.rows * self.response


@dataclass
class Case:
    """One child-process measurement."""

    model: str
    pass_name: str
    path: str
    shape: Shape
    device: str
    dtype: str
    reps: int
    warmup: int
    vocab: int = LARGE_VOCAB
    backend: str = "auto"


@dataclass
class Result:
    model: str
    pass_name: str
    path: str
    tokens: int
    vocab: int
    seconds: float | None = None
    peak_mib: float | None = None
    note: str = ""


# --------------------------------------------------------------------------------------------------------------
# child: build, run, measure
# --------------------------------------------------------------------------------------------------------------
def build_model(name: str, dtype: torch.dtype, device: str, vocab: int = LARGE_VOCAB):
    """``(model, pad_id)``: random weights, deterministic; ``vocab`` sizes the large-vocabulary model."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    if name == "large_vocab":
        config = Qwen3Config(vocab_size=vocab, hidden_size=1024, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=4, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                             max_position_embeddings=4096, pad_token_id=0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
        pad_id = 0
    elif name == "zoo":
        from openrlhf_hacpo.zoo.models import build_model as build_zoo_model
        from openrlhf_hacpo.zoo.presets import AGENTS
        from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

        agent = AGENTS["qwenM"]
        tokenizer = build_tokenizer(agent.tokenizer)
        model = build_zoo_model(agent.model, tokenizer, seed=0).to(dtype)
        pad_id = tokenizer.pad_token_id
    else:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    return model.to(device), pad_id


def make_batch(model, pad_id: int, shape: Shape, device: str) -> dict:
    from openrlhf_hacpo.utils.padding import pack_rows

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    low = 1 if pad_id == 0 else 0  # keep the pad id out of the random tokens
    prompts = torch.randint(low, vocab, (shape.rows, shape.prompt), generator=gen).tolist()
    responses = torch.randint(low, vocab, (shape.rows, shape.response), generator=gen).tolist()
    return pack_rows(prompts, responses, pad_id).to(device)


def make_step(case: Case, model, padded: dict):
    """The callable one repetition runs."""
    from hacpo_kernels import LossParams, hacpo_loss
    from openrlhf_hacpo.models.logprobs import response_logprobs

    if case.pass_name == "score":
        model.eval()

        def score():
            with torch.no_grad():
                return response_logprobs(model, padded, 1.0, path=case.path, backend=case.backend).logp

        return score
    model.train()
    mask = padded["response_mask"]
    rows = mask.shape[0]
    gen = torch.Generator().manual_seed(2)
    dev = mask.device
    ref_logp = (-torch.rand(mask.shape, generator=gen) * 3).to(dev)
    old_mean = (-torch.rand(rows, generator=gen) * 3).to(dev)
    adv = torch.randn(rows, generator=gen).to(dev)
    is_own = (torch.arange(rows) % 2 == 0).to(dev)
    coef = torch.ones(rows).to(dev)
    for p in model.parameters():  # steady state: the gradient buffers exist before the step
        p.grad = torch.zeros_like(p)

    def update():
        out = response_logprobs(model, padded, 1.0, with_entropy=True, path=case.path, backend=case.backend)
        loss = hacpo_loss(out.logp, mask, adv, old_mean, is_own, coef, LossParams(kl_coef=0.01, update_index=1),
                          ref_logp=ref_logp, backend=case.backend).loss
        loss.backward()

    return update


def run_case(case: Case) -> dict:
    """Build the model and batch, then time ``case.reps`` repetitions and take the peak memory above them."""
    cuda = case.device == "cuda"
    if not cuda:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        _pin_malloc_to_mmap()
    model, pad_id = build_model(case.model, getattr(torch, case.dtype), case.device, case.vocab)
    padded = make_batch(model, pad_id, case.shape, case.device)
    step = make_step(case, model, padded)
    for _ in range(case.warmup):
        step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        if not _reset_peak_rss():
            raise RuntimeError("/proc/self/clear_refs is not writable: cannot measure the peak resident set")
        base = _status_kib("VmRSS") * 1024
    times = []
    for _ in range(case.reps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kib("VmHWM") * 1024
    return {"seconds": statistics.median(times), "peak_mib": (peak - base) / MIB,
            "vocab": model.config.vocab_size}


def measure(case: Case, timeout_s: float, in_process: bool = False) -> Result:
    """Run ``case`` in a fresh child process (clean peak memory) and parse its one-line JSON answer; with
    ``in_process`` run it here (faster to start, peaks may be hidden by memory freed earlier in the process)."""
    result = Result(case.model, case.pass_name, case.path, case.shape.tokens, 0)
    if in_process:
        try:
            answer = run_case(case)
        except Exception as exc:  # noqa: BLE001 - an OOM is a result too
            result.note = "OOM" if "out of memory" in str(exc).lower() else f"error: {type(exc).__name__}: {exc}"[:160]
            return result
        finally:
            gc.collect()
            if case.device == "cuda":
                torch.cuda.empty_cache()
        result.seconds, result.peak_mib, result.vocab = answer["seconds"], answer["peak_mib"], answer["vocab"]
        return result
    payload = json.dumps({**asdict(case), "shape": asdict(case.shape)})
    try:
        proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child", payload],
                              capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        result.note = f"timed out after {timeout_s:.0f} s"
        return result
    answers = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not answers:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        result.note = "OOM" if "out of memory" in proc.stderr.lower() else f"child failed: {tail[:160]}"
        return result
    answer = json.loads(answers[-1])
    result.seconds, result.peak_mib, result.vocab = answer["seconds"], answer["peak_mib"], answer["vocab"]
    return result


# --------------------------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------------------------
def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def ratios(results: list[Result]) -> list[dict]:
    """Per (model, pass): fused/logits ratios of seconds and peak memory, and the CPU targets where they apply."""
    by_key = {(r.model, r.pass_name, r.path): r for r in results}
    out = []
    for model in MODELS:
        for pass_name in PASSES:
            logits, fused = by_key.get((model, pass_name, "logits")), by_key.get((model, pass_name, "fused"))
            if logits is None or fused is None:
                continue
            row = {"model": model, "pass": pass_name, "time_ratio": None, "memory_ratio": None}
            if logits.seconds and fused.seconds:
                row["time_ratio"] = fused.seconds / logits.seconds
            if logits.peak_mib and fused.peak_mib is not None and logits.peak_mib > 0:
                row["memory_ratio"] = fused.peak_mib / logits.peak_mib
            out.append(row)
    return out


def verdicts(row: dict, device: str, vocab: int) -> str:
    """The issue's CPU targets (vocabulary 151,936 only); empty elsewhere."""
    if device != "cpu" or vocab != LARGE_VOCAB:
        return ""
    parts = []
    mem_target = CPU_TARGETS[row["pass"]]
    if row["memory_ratio"] is not None:
        met = "met" if row["memory_ratio"] <= mem_target else "NOT met"
        parts.append(f"memory <= {mem_target:.0%}: {met}")
    if row["time_ratio"] is not None:
        met = "met" if row["time_ratio"] <= TIME_TARGET else "NOT met"
        parts.append(f"time <= {TIME_TARGET}x: {met}")
    return "; ".join(parts)


def markdown(meta: dict, results: list[Result], ratio_rows: list[dict]) -> str:
    out = [f"# Step benchmark ({meta['device_name']})", "", f"Command: `{meta['command']}`  ",
           f"torch {meta['torch']}, {meta['dtype']}, {meta['platform']}; seconds are the median of {meta['reps']} "
           f"repetition(s) after {meta['warmup']} warm-up(s), "
           f"{'in one process' if meta['in_process'] else 'each (model, pass, path) in a fresh process'}; peak "
           "memory is above the model, the batch and the parameter gradients "
           f"({'peak RSS' if meta['device'] == 'cpu' else 'torch.cuda.max_memory_allocated'}).", ""]
    if not meta.get("complete", True):
        out += ["**Partial run** (stopped before every case was measured).", ""]
    out += ["| model | pass | path | response tokens | vocab | seconds | peak MiB | note |",
            "|---|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        out.append(f"| {r.model} | {r.pass_name} | {r.path} | {r.tokens} | {r.vocab or '-'} | {_fmt(r.seconds)} | "
                   f"{_fmt(r.peak_mib, 0)} | {r.note} |")
    out += ["", "## fused / logits", "", "| model | pass | time ratio | peak memory ratio | targets |",
            "|---|---|---:|---:|---|"]
    vocab = {r.model: r.vocab for r in results}
    for row in ratio_rows:
        out.append(f"| {row['model']} | {row['pass']} | {_fmt(row['time_ratio'])} | {_fmt(row['memory_ratio'])} | "
                   f"{verdicts(row, meta['device'], vocab.get(row['model'], 0))} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------------------
def parse_shape(text: str) -> Shape:
    try:
        rows, prompt, response = (int(v) for v in text.lower().split("x"))
        return Shape(rows, prompt, response)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxPROMPTxRESPONSE, got {text!r}") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, no warm-up (the CPU size)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    parser.add_argument("--large-shape", type=parse_shape, default=None,
                        help="ROWSxPROMPTxRESPONSE of the large-vocabulary model (CPU 8x32x512, GPU 8x128x1024)")
    parser.add_argument("--zoo-shape", type=parse_shape, default=Shape(64, 32, 64),
                        help="ROWSxPROMPTxRESPONSE of the zoo agent (default 64x32x64; its context is 128)")
    parser.add_argument("--vocab", type=int, default=LARGE_VOCAB,
                        help=f"vocabulary of the large-vocabulary model (default {LARGE_VOCAB})")
    parser.add_argument("--in-process", action="store_true",
                        help="CPU: measure in this process instead of one child process per case (less clean "
                             "peaks); always so on CUDA")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {MODELS}")
    parser.add_argument("--passes", default=",".join(PASSES), help=f"comma-separated subset of {PASSES}")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (CPU 3, --quick 1; GPU 5)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    parser.add_argument("--out", default=None, help="file stem under benchmarks/results (default step_<device>)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        spec = json.loads(args.child)
        spec["shape"] = Shape(**spec["shape"])
        print(json.dumps(run_case(Case(**spec))), flush=True)
        return 0

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    for flag, chosen, allowed in (("--models", models, MODELS), ("--passes", passes, PASSES)):
        for item in chosen:
            if item not in allowed:
                parser.error(f"{flag}: {item!r} is not one of {allowed}")
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    cuda = device == "cuda"
    dtype = "bfloat16" if cuda else "float32"
    reps = args.reps or (5 if cuda else 1 if args.quick else 3)
    warmup = 1 if cuda or not args.quick else 0
    large = args.large_shape or (Shape(8, 128, 1024) if cuda else Shape(8, 32, 512))
    shapes = {"large_vocab": large, "zoo": args.zoo_shape}
    meta = run_facts(device, argv, dtype=dtype, reps=reps, warmup=warmup,
                     shapes={m: asdict(shapes[m]) for m in models}, in_process=args.in_process or cuda)
    stem = args.out or f"step_{device}"
    results: list[Result] = []

    def report(complete: bool) -> tuple[dict, str]:
        meta["complete"] = complete
        ratio_rows = ratios(results)
        payload = {"meta": meta, "results": [asdict(r) for r in results], "ratios": ratio_rows}
        return payload, markdown(meta, results, ratio_rows)

    # the committed step_<device>.{json,md} are replaced only by a finished run; figures so far go to
    # step_<device>.failed.md, where they stay if the run stops
    with ResultWriter(stem, RESULTS_DIR, name="bench_step") as out:
        for model in models:
            for pass_name in passes:
                for path in PATHS:
                    case = Case(model, pass_name, path, shapes[model], device, dtype, reps, warmup, args.vocab)
                    result = measure(case, args.timeout, args.in_process or cuda)
                    results.append(result)
                    print(f"  {model:12s} {pass_name:7s} {path:7s} tokens={result.tokens:6d} "
                          f"s={_fmt(result.seconds)} peak={_fmt(result.peak_mib, 0)} MiB {result.note}", flush=True)
                    out.progress(report(complete=False)[1])
        payload, md = report(complete=True)
        out.commit({".json": payload, ".md": md})
    print(f"\nwrote {RESULTS_DIR / stem}.json and .md\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
