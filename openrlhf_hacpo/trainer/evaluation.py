"""Periodic evaluation of each agent alone on validation sets: greedy accuracy and pass@k, overall and per set.

At inference every agent is deployed alone (the paper's setting), so each is evaluated on its own: one greedy response per
prompt gives the accuracy (fraction of prompts whose response gets a reward > 0), and with ``k = eval_n_samples > 1``
k responses sampled at ``eval_temperature`` give the unbiased pass@j estimate for j = 1, k (Chen et al. 2021):

    pass@j = mean over prompts of 1 − C(k − c, j) / C(k, j),   c = correct samples of the prompt.

Validation prompts may come from several files (``eval_data`` = comma-separated paths); each prompt belongs to a
``data_source`` (its record's field, else the file's stem), and with more than one source every figure is also
reported per source as ``<figure>/<data_source>``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from openrlhf_hacpo.data.prompts import PromptRecord, load_prompt_dataset
from openrlhf_hacpo.engines.base import SamplingConfig
from openrlhf_hacpo.utils.pass_at_k import pass_at_k
from openrlhf_hacpo.utils.seeding import derive_seed

__all__ = ["Evaluator", "load_eval_records", "data_source_of"]


def data_source_of(record: PromptRecord) -> str:
    """The record's ``data_source`` field (set by :func:`load_eval_records` for every validation record)."""
    source = record.metadata.get("data_source")
    if not isinstance(source, str) or not source:
        raise ValueError(f"validation prompt {record.prompt_id!r} has no data_source")
    return source


def load_eval_records(paths: str, input_key: str, label_key: str | None, split: str,
                      max_samples: int | None = None) -> list[PromptRecord]:
    """Validation records of one or several comma-separated files (``max_samples`` applies to each file).

    A record keeps its own ``data_source`` field; a record without one gets its file's stem (or the hub name).
    Prompt ids must be unique over all files.
    """
    names = [p.strip() for p in paths.split(",") if p.strip()]
    if not names:
        raise ValueError(f"eval_data {paths!r} names no file")
    records: list[PromptRecord] = []
    seen: dict[str, str] = {}
    for name in names:
        default_source = Path(name).stem if Path(name).suffix else name
        for record in load_prompt_dataset(name, input_key, label_key, split, max_samples):
            if record.prompt_id in seen:
                raise ValueError(f"eval_data: prompt_id {record.prompt_id!r} of {name} also occurs in "
                                 f"{seen[record.prompt_id]}; prompt ids must be unique over all evaluation files")
            seen[record.prompt_id] = name
            source = record.metadata.get("data_source") or default_source
            records.append(replace(record, metadata={**record.metadata, "data_source": str(source)}))
    return records


class Evaluator:
    """Evaluates agent groups on fixed validation prompts.

    Args:
        records: validation prompt records (``prompt_id``, ``prompt``, ``label``, ``metadata["data_source"]``).
        reward_runner: scores responses (the training verifier).
        max_new_tokens: response length cap.
        num_samples: k of pass@k; 1 evaluates greedy decoding only.
        temperature: sampling temperature of the pass@k samples.
        seed: run seed (the samples of step t use ``derive_seed(seed, "eval", t, agent)``).
    """

    def __init__(self, records: Sequence[Any], reward_runner: Any, max_new_tokens: int, num_samples: int = 1,
                 temperature: float = 1.0, seed: int = 0) -> None:
        if not records:
            raise ValueError("evaluation needs at least one prompt")
        self.records = list(records)
        self.sources = [record.metadata.get("data_source", "") for record in self.records]
        self.reward_runner = reward_runner
        self.greedy = SamplingConfig(n=1, greedy=True, max_new_tokens=max_new_tokens)
        self.sampled = (SamplingConfig(n=num_samples, temperature=temperature, max_new_tokens=max_new_tokens)
                        if num_samples > 1 else None)
        self.seed = seed

    def _score(self, outputs: Sequence[Any], prompt_texts: Sequence[str]) -> list[float]:
        """Rewards as in training: reward files see the agent's rendered prompt (queries = prompt + response)."""
        prompts = [prompt_texts[o.prompt_index] for o in outputs]
        labels = [self.records[o.prompt_index].label for o in outputs]
        return self.reward_runner([o.response_text for o in outputs], prompts, labels)

    def _figures(self, indices: Sequence[int], greedy_rewards: Sequence[float], greedy_tokens: Sequence[int],
                 correct: Sequence[int] | None) -> dict[str, float]:
        """The figures of the prompts ``indices`` (greedy reward / tokens per prompt, correct samples per prompt)."""
        out = {
            "accuracy": sum(greedy_rewards[i] > 0 for i in indices) / len(indices),
            "reward_mean": sum(greedy_rewards[i] for i in indices) / len(indices),
            "response_tokens": sum(greedy_tokens[i] for i in indices) / len(indices),
        }
        if correct is not None:
            n = self.sampled.n
            out["sample_accuracy"] = sum(correct[i] for i in indices) / (n * len(indices))
            for k in sorted({1, n}):
                out[f"pass@{k}"] = sum(pass_at_k(n, correct[i], k) for i in indices) / len(indices)
        return out

    def evaluate(self, groups: Sequence[Any], step: int) -> list[dict[str, Any]]:
        """One record per agent: ``accuracy``, ``reward_mean``, ``response_tokens``, ``num_prompts`` and, with
        samples, ``sample_accuracy``, ``pass@1``, ``pass@k``; with several data sources also ``<figure>/<source>``."""
        greedy = [g.generate(self.records, self.greedy) for g in groups]
        sampled = [g.generate(self.records, replace(self.sampled, seed=derive_seed(self.seed, "eval", step, g.name)))
                   for g in groups] if self.sampled is not None else [None] * len(groups)
        by_source: dict[str, list[int]] = defaultdict(list)
        for index, source in enumerate(self.sources):
            by_source[source].append(index)
        records = []
        for group, g_pending, s_pending in zip(groups, greedy, sampled):
            outputs = sorted(g_pending.result(), key=lambda o: o.prompt_index)
            prompt_texts = group.render_prompt_texts(self.records)
            rewards = self._score(outputs, prompt_texts)
            tokens = [o.num_tokens for o in outputs]
            correct = None
            if s_pending is not None:
                outs = s_pending.result()
                correct = [0] * len(self.records)
                for out, score in zip(outs, self._score(outs, prompt_texts)):
                    correct[out.prompt_index] += int(score > 0)
            rec: dict[str, Any] = {"step": step, "agent": group.name, "num_prompts": len(self.records)}
            rec.update(self._figures(range(len(self.records)), rewards, tokens, correct))
            if len(by_source) > 1:
                for source, indices in sorted(by_source.items()):
                    for name, value in self._figures(indices, rewards, tokens, correct).items():
                        rec[f"{name}/{source}"] = value
            records.append(rec)
        return records
