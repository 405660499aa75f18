"""Periodic evaluation of each agent alone on a validation set: greedy accuracy and pass@k.

At inference every agent is deployed alone (spec §1), so each is evaluated on its own: one greedy response per
prompt gives the accuracy (fraction of prompts whose response gets a reward > 0), and with ``k = eval_n_samples > 1``
k responses sampled at ``eval_temperature`` give the unbiased pass@j estimate for j = 1, k (Chen et al. 2021):

    pass@j = mean over prompts of 1 − C(k − c, j) / C(k, j),   c = correct samples of the prompt.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

from openrlhf_hacpo.engines.base import SamplingConfig, derive_seed

__all__ = ["pass_at_k", "Evaluator"]


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one prompt: 1 − C(n − c, k) / C(n, k) for n samples of which c are correct."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"k must be in [1, {num_samples}], got {k}")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be in [0, {num_samples}], got {num_correct}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


class Evaluator:
    """Evaluates agent groups on fixed validation prompts.

    Args:
        records: validation prompt records (``prompt_id``, ``prompt``, ``label``).
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

    def evaluate(self, groups: Sequence[Any], step: int) -> list[dict[str, Any]]:
        """One record per agent: ``eval/accuracy``, ``eval/response_tokens``, and with samples ``eval/pass@1``,
        ``eval/pass@k``, ``eval/sample_accuracy``."""
        greedy = [g.generate(self.records, self.greedy) for g in groups]
        sampled = [g.generate(self.records, replace(self.sampled, seed=derive_seed(self.seed, "eval", step, g.name)))
                   for g in groups] if self.sampled is not None else [None] * len(groups)
        records = []
        for group, g_pending, s_pending in zip(groups, greedy, sampled):
            outputs = g_pending.result()
            prompt_texts = group.render_prompt_texts(self.records)
            rewards = self._score(outputs, prompt_texts)
            rec: dict[str, Any] = {
                "step": step,
                "agent": group.name,
                "accuracy": sum(r > 0 for r in rewards) / len(rewards),
                "reward_mean": sum(rewards) / len(rewards),
                "response_tokens": sum(o.num_tokens for o in outputs) / len(outputs),
                "num_prompts": len(self.records),
            }
            if s_pending is not None:
                outs = s_pending.result()
                scores = self._score(outs, prompt_texts)
                n = self.sampled.n
                correct = [0] * len(self.records)
                for out, score in zip(outs, scores):
                    correct[out.prompt_index] += int(score > 0)
                rec["sample_accuracy"] = sum(correct) / (n * len(self.records))
                for k in sorted({1, n}):
                    rec[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
            records.append(rec)
        return records
