"""One trained baseline in two settings: copy an agent's results into another pair's cell, labelled as such.

The single-agent baselines (GSPO, GSPO×2, GRPO) of a model train that model alone, so they do not depend on the
pair. Qwen3-4B-Base belongs to two Table 1 pairs, and the paper prints identical Qwen3-4B-Base baseline rows in both.
``reproduce_table1.sh`` with ``SHARE_BASELINES=1`` trains such a baseline once, in the first pair that has it, and
this module files its evaluation under the later pair too:

    python -m openrlhf_hacpo.reproduce.share --results runs/table1/eval/qwen3_1.7b_4b/gspo \\
        --model Qwen/Qwen3-4B-Base --pair qwen3_4b_llama3.2_3b --output_dir runs/table1/eval/qwen3_4b_llama3.2_3b/gspo

Every result of that model under ``--results`` is written to ``<output_dir>/shared__<model>/<benchmark>.json`` with
the later pair's ``setting`` and ``settings.shared_from`` naming the run and setting it came from; values, metrics
and the rest are unchanged.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.reproduce.evaluate import LAUNCHER_PAIRS
from openrlhf_hacpo.reproduce.paper_tables import HUB_MODEL_IDS, paper_model_name
from openrlhf_hacpo.reproduce.results import read_results, write_results

__all__ = ["main", "share_results"]

SHARED_PREFIX = "shared__"


def _model_name(model: str) -> str:
    return model if model in HUB_MODEL_IDS else paper_model_name(model)


def share_results(results_dir: str | Path, model: str, pair: str, output_dir: str | Path) -> list[Path]:
    """Copy ``model``'s results found under ``results_dir`` into ``output_dir`` for the launcher pair ``pair``.

    Returns the files written. Raises ValueError for an unknown pair or model, or when ``results_dir`` holds no result
    of the model (the message names the folder and the models it does hold).
    """
    if pair not in LAUNCHER_PAIRS:
        raise ValueError(f"--pair {pair!r} is not one of {', '.join(LAUNCHER_PAIRS)}")
    name = _model_name(model)
    results = read_results([results_dir])
    found = [r for r in results if r.model == name]
    if not found:
        raise ValueError(f"no result of {name} under {results_dir} (models there: "
                         f"{sorted({r.model for r in results}) or 'none'})")
    setting = LAUNCHER_PAIRS[pair]
    written = []
    for result in found:
        settings = {**result.settings, "shared_from": f"run {result.run}, setting {result.setting}"}
        copy = dataclasses.replace(result, setting=setting, settings=settings)
        out = Path(output_dir) / f"{SHARED_PREFIX}{name}" / f"{result.benchmark}.json"
        written.append(write_results(out, [copy]))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_hacpo.reproduce.share", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="the evaluation folder of the run that trained the model")
    p.add_argument("--model", required=True, help="hub id or the paper's name of the model")
    p.add_argument("--pair", required=True, help=f"the pair that reuses it: {', '.join(LAUNCHER_PAIRS)}")
    p.add_argument("--output_dir", required=True, help="the evaluation folder of the pair's run")
    args = p.parse_args(argv)
    try:
        written = share_results(args.results, args.model, args.pair, args.output_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"share: error: {err}", file=sys.stderr)
        return 2
    print(f"[share] {len(written)} results of {args.model} filed under {args.output_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
