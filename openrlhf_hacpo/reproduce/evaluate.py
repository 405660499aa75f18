"""Evaluate models on benchmark files as the paper does: greedy avg@1 everywhere, sampled best@k where asked.

A *target* is one model folder (or hub id): a base model, an HF checkpoint, or one agent of a run folder
(``<run>/hf/<agent>/``, as the trainer saves them). Every benchmark file holds prompt rows as ``prepare`` writes them
(``input``, ``label``, ``prompt_id``, ``data_source``). For each target:

1. every prompt is rendered with the target's own chat template (generation prompt added, ``enable_thinking`` False
   by default, no system prompt of ours) and tokenized; prompts longer than ``prompt_max_len`` tokens are dropped
   (as the official code filters them), and their ids are recorded;
2. one greedy response per prompt (T = 0, n = 1) of at most ``generate_max_len`` tokens gives avg@1 = mean@1;
3. for the sets in ``sampled`` (AIME 2025: k = 30), n = k responses sampled at ``temperature`` / ``top_p`` give
   mean@k, verl's bootstrap best@k, its closed form and the unbiased pass@k
   (:mod:`openrlhf_hacpo.reproduce.metrics`). The sampling settings are recorded as an assumption: the paper states
   none;
4. responses are scored by the verifier (``boxed_exact`` reproduces the official reward).

Outputs (atomic writes, one pair per benchmark as soon as it is done) under ``<output_dir>/<target>/``:
``<data_source>.json`` (metrics, counts, settings, assumptions) and ``<data_source>.generations.jsonl`` (one line per
response: prompt id, mode, text, token count, finish reason, reward).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from openrlhf_hacpo.data.prompts import PromptRecord, load_prompt_dataset
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.reproduce.benchmarks import BENCHMARKS
from openrlhf_hacpo.reproduce.metrics import benchmark_metrics
from openrlhf_hacpo.utils.atomic import atomic_write_json, atomic_write_text

__all__ = ["RESULT_FORMAT", "EvalSettings", "Target", "Benchmark", "find_targets", "load_benchmarks",
           "evaluate_target"]

RESULT_FORMAT = "openrlhf-hacpo/eval-result/1"
SAMPLED_BENCHMARKS = {b.name: int(b.metric.split("@")[1]) for b in BENCHMARKS if (b.metric or "").startswith("best@")}
"""The sets whose paper metric is best@k (AIME 2025: best@30), with their k."""
GENERATIONS_SUFFIX = ".generations.jsonl"


@dataclass(frozen=True)
class EvalSettings:
    """How targets are evaluated.

    Attributes:
        backend: ``vllm`` (data-parallel engines) or ``hf`` (transformers generate).
        prompt_max_len: longer prompts (in the target's tokens) are dropped and recorded.
        generate_max_len: max new tokens of every response.
        sampled: data_source -> k: sets that also get k sampled responses per prompt (best@k, mean@k, pass@k).
        temperature / top_p / top_k: sampling of those responses.
        seed: sampling seed.
        reward_fn: verifier (registered name or reward file).
        apply_chat_template / enable_thinking: prompt rendering (``enable_thinking`` None passes nothing).
        dtype: weights' dtype.
        num_engines: vLLM engines (None: one per ``tensor_parallel_size`` GPUs, one on CPU).
        tensor_parallel_size / gpu_memory_utilization: vLLM engine settings.
        hf_batch_size: rows per ``generate`` call of the hf backend.
    """

    backend: str = "vllm"
    prompt_max_len: int = 1024
    generate_max_len: int = 8196
    sampled: dict[str, int] = field(default_factory=lambda: dict(SAMPLED_BENCHMARKS))
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 42
    reward_fn: str = "boxed_exact"
    apply_chat_template: bool = True
    enable_thinking: bool | None = False
    dtype: str = "bfloat16"
    num_engines: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    hf_batch_size: int = 16

    def __post_init__(self) -> None:
        from openrlhf_hacpo.reproduce.generation import BACKENDS

        if self.backend not in BACKENDS:
            raise ValueError(f"EvalSettings.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("prompt_max_len", "generate_max_len", "tensor_parallel_size", "hf_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EvalSettings.{name} must be a positive int, got {value!r}")
        for source, k in self.sampled.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 2:
                raise ValueError(f"EvalSettings.sampled[{source!r}] must be an int >= 2 (samples per prompt), got {k!r}")
        if not self.temperature > 0:
            raise ValueError(f"EvalSettings.temperature must be > 0 for sampled sets, got {self.temperature}")

    def assumptions(self, data_source: str) -> dict[str, Any]:
        """What the paper leaves open and this evaluation fixed, for one benchmark."""
        if data_source not in self.sampled:
            return {}
        return {"sampling": {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                             "n": self.sampled[data_source], "seed": self.seed,
                             "why": "the paper states no sampling settings for best@k; these are training's"}}


@dataclass(frozen=True)
class Target:
    """One model to evaluate: ``name`` names its output folder; ``run`` / ``agent`` when it comes from a run."""

    name: str
    path: str
    run: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class Benchmark:
    """The prompts of one data_source and the file they came from."""

    data_source: str
    file: str
    sha256: str
    records: list[PromptRecord]


def find_targets(models: Sequence[str] = (), runs: Sequence[str] = ()) -> list[Target]:
    """Targets of model folders / hub ids and of run folders (every agent under ``<run>/hf/``)."""
    targets = []
    for model in models:
        path = Path(model).expanduser()
        name = path.name if path.exists() else str(model).replace("/", "__")
        targets.append(Target(name=name, path=str(path) if path.exists() else str(model)))
    for run in runs:
        hf = Path(run).expanduser() / "hf"
        agents = sorted(p for p in hf.iterdir() if (p / "config.json").is_file()) if hf.is_dir() else []
        if not agents:
            raise FileNotFoundError(f"run folder {run}: no agent checkpoints under {hf} (hf/<agent>/config.json); "
                                    "was the run saved with --no_save_hf or not finished?")
        for agent in agents:
            targets.append(Target(name=f"{Path(run).name}__{agent.name}", path=str(agent), run=str(run),
                                  agent=agent.name))
    names = [t.name for t in targets]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"two targets would write to the same output folder: {repeated}")
    if not targets:
        raise ValueError("nothing to evaluate: give --model and/or --run")
    return targets


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_benchmarks(files: Sequence[str], max_samples: int | None = None) -> list[Benchmark]:
    """Benchmarks of prepared jsonl files, one per data_source (a file may hold several; rows without a
    ``data_source`` take the file's stem). A data_source or prompt id in two places is an error."""
    by_source: dict[str, Benchmark] = {}
    seen_ids: dict[str, str] = {}
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"benchmark file {name} does not exist")
        digest = _sha256(path)
        groups: dict[str, list[PromptRecord]] = defaultdict(list)
        for record in load_prompt_dataset(path, "input", "label", max_samples=max_samples):
            if record.label is None or record.label == "":
                raise ValueError(f"{name}: prompt {record.prompt_id!r} has an empty label")
            if record.prompt_id in seen_ids:
                raise ValueError(f"{name}: prompt_id {record.prompt_id!r} also occurs in {seen_ids[record.prompt_id]}")
            seen_ids[record.prompt_id] = name
            groups[str(record.metadata.get("data_source") or path.stem)].append(record)
        for source, records in groups.items():
            if source in by_source:
                raise ValueError(f"data_source {source!r} occurs in {by_source[source].file} and in {name}")
            by_source[source] = Benchmark(source, str(path), digest, records)
    return list(by_source.values())


def _render(records: Sequence[PromptRecord], tokenizer: Any, settings: EvalSettings) -> tuple[list[str], list[list[int]]]:
    """Prompt texts (what reward files see) and untruncated prompt ids, in the target's own rendering."""
    from openrlhf_hacpo.rollout.views import LearnerViewConfig, render_prompt_ids, render_prompt_text

    view = LearnerViewConfig(prompt_max_len=None, generate_max_len=None,
                             apply_chat_template=settings.apply_chat_template,
                             enable_thinking=settings.enable_thinking if settings.apply_chat_template else None)
    texts = [render_prompt_text(record.prompt, tokenizer, view) for record in records]
    return texts, [render_prompt_ids(record.prompt, tokenizer, view) for record in records]


def _generation_line(target: Target, bench: Benchmark, record: PromptRecord, mode: str, out: GenerationOutput,
                     prompt_tokens: int, reward: float) -> dict[str, Any]:
    return {"target": target.name, "data_source": bench.data_source, "prompt_id": record.prompt_id, "mode": mode,
            "sample_index": out.sample_index, "label": record.label, "prompt_tokens": prompt_tokens,
            "response_tokens": out.num_tokens, "finish_reason": out.finish_reason, "reward": reward,
            "response": out.response_text}


def evaluate_target(target: Target, benchmarks: Sequence[Benchmark], settings: EvalSettings, output_dir: str | Path,
                    generator: Any | None = None, log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Evaluate one target on every benchmark; write ``<output_dir>/<target>/``; return data_source -> result.

    ``generator`` (a :mod:`~openrlhf_hacpo.reproduce.generation` backend) is built from ``settings`` when None and
    closed at the end in that case.
    """
    from transformers import AutoTokenizer

    from openrlhf_hacpo.reproduce.generation import make_generator
    from openrlhf_hacpo.rollout.rewards import RewardRunner

    out_dir = Path(output_dir) / target.name
    tokenizer = AutoTokenizer.from_pretrained(target.path)
    own_generator = generator is None
    if own_generator:
        generator = make_generator(settings.backend, target.path, prompt_max_len=settings.prompt_max_len,
                                   generate_max_len=settings.generate_max_len, seed=settings.seed,
                                   dtype=settings.dtype, num_engines=settings.num_engines,
                                   tensor_parallel_size=settings.tensor_parallel_size,
                                   gpu_memory_utilization=settings.gpu_memory_utilization,
                                   hf_batch_size=settings.hf_batch_size)
    runner = RewardRunner(settings.reward_fn)
    greedy = SamplingConfig(n=1, greedy=True, max_new_tokens=settings.generate_max_len)
    results: dict[str, dict[str, Any]] = {}
    try:
        for bench in benchmarks:
            t0 = time.perf_counter()
            all_texts, all_ids = _render(bench.records, tokenizer, settings)
            kept = [i for i, ids in enumerate(all_ids) if len(ids) <= settings.prompt_max_len]
            dropped = [r.prompt_id for r, ids in zip(bench.records, all_ids) if len(ids) > settings.prompt_max_len]
            if not kept:
                raise ValueError(f"{target.name}: every prompt of {bench.data_source} is longer than "
                                 f"prompt_max_len={settings.prompt_max_len} tokens")
            records = [bench.records[i] for i in kept]
            prompt_ids = [all_ids[i] for i in kept]
            prompt_texts = [all_texts[i] for i in kept]
            lines: list[dict[str, Any]] = []
            passes = [("greedy", greedy)]
            k = settings.sampled.get(bench.data_source)
            if k is not None:
                passes.append(("sampled", SamplingConfig(n=k, temperature=settings.temperature, top_p=settings.top_p,
                                                         top_k=settings.top_k, seed=settings.seed,
                                                         max_new_tokens=settings.generate_max_len)))
            metrics: dict[str, float] = {}
            tokens: dict[str, float] = {}
            for mode, sampling in passes:
                outputs = sorted(generator.generate(prompt_ids, sampling),
                                 key=lambda o: (o.prompt_index, o.sample_index))
                labels = [records[o.prompt_index].label for o in outputs]
                rewards = runner([o.response_text for o in outputs], [prompt_texts[o.prompt_index] for o in outputs],
                                 labels)
                per_prompt: dict[str, list[float]] = defaultdict(list)
                for o, reward in zip(outputs, rewards):
                    record = records[o.prompt_index]
                    per_prompt[record.prompt_id].append(float(reward))
                    lines.append(_generation_line(target, bench, record, mode, o, len(prompt_ids[o.prompt_index]),
                                                  float(reward)))
                summary = benchmark_metrics(bench.data_source, dict(per_prompt))
                if mode == "greedy":
                    metrics["avg@1"] = summary.mean_at_n
                else:
                    metrics.update(summary.named())
                tokens[mode] = sum(o.num_tokens for o in outputs) / len(outputs)
            headline = f"best@{k}" if k is not None else "avg@1"
            result = {
                "format": RESULT_FORMAT,
                "target": target.name,
                "model_path": target.path,
                "run": target.run,
                "agent": target.agent,
                "data_source": bench.data_source,
                "data_file": bench.file,
                "data_sha256": bench.sha256,
                "metric": headline,
                "value": metrics[headline],
                "metrics": metrics,
                "num_prompts": len(records),
                "dropped_prompt_ids": dropped,
                "mean_response_tokens": tokens,
                "settings": {**asdict(settings), "sampled": dict(settings.sampled)},
                "assumptions": settings.assumptions(bench.data_source),
                "generations_file": f"{bench.data_source}{GENERATIONS_SUFFIX}",
                "seconds": time.perf_counter() - t0,
            }
            atomic_write_text(out_dir / f"{bench.data_source}{GENERATIONS_SUFFIX}",
                              "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
            atomic_write_json(out_dir / f"{bench.data_source}.json", result)
            results[bench.data_source] = result
            log(f"[evaluate] {target.name} {bench.data_source}: {headline} {metrics[headline]:.4f} on "
                f"{len(records)} prompts ({len(dropped)} dropped, {result['seconds']:.1f}s)")
    finally:
        runner.close()
        if own_generator:
            generator.close()
    return results
