"""How an agent's work is cut between its workers: prompt shards, per-shard seeds, engine outputs regrouped."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.utils.seeding import derive_seed
from openrlhf_hacpo.utils.partition import split_evenly

__all__ = ["outputs_for_shard", "reindex", "shard_sampling", "split_shards"]


def split_shards(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Contiguous shards of ``items`` for ``parts`` workers, sizes differing by at most one."""
    return [list(items[r.start:r.stop]) for r in split_evenly(len(items), parts)]


def shard_sampling(sampling: SamplingConfig, shard: int) -> SamplingConfig:
    """Shard ``shard`` of a seeded call gets its own derived seed (shard 0 keeps the call's seed)."""
    if sampling.seed is None or shard == 0:
        return sampling
    return replace(sampling, seed=derive_seed(sampling.seed, "shard", shard))


def reindex(output: GenerationOutput, prompt_index: int) -> GenerationOutput:
    return replace(output, prompt_index=prompt_index)


def outputs_for_shard(shard: Sequence[int], engine_shards: Sequence[Sequence[int]],
                      engine_outputs: Sequence[Sequence[GenerationOutput]]) -> list[GenerationOutput]:
    """The outputs of the prompts in ``shard`` (global prompt indices), each renumbered to its prompt's position in
    ``shard``, in engine order. Engine e sampled the prompts ``engine_shards[e]``; its outputs number them from 0."""
    local = {p: i for i, p in enumerate(shard)}
    picked = []
    for prompts, outputs in zip(engine_shards, engine_outputs):
        for out in outputs:
            index = prompts[out.prompt_index]
            if index in local:
                picked.append(reindex(out, local[index]))
    return picked
