"""Accuracy of one Hugging Face model + tokenizer on arithmetic problems (the rollout engine's batched
``generate``, left padding).

Greedy accuracy is the headline number. With ``num_samples = n > 0`` each problem is also sampled ``n`` times at
``temperature`` (no top-k / top-p), giving the mean sample accuracy and the unbiased pass@k estimate
(Chen et al. 2021) for every k <= n:

    pass@k = mean over problems of  1 - C(n - c, k) / C(n, k),   c = number of correct samples.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openrlhf_hacpo.data.arithmetic import Problem, arithmetic_reward
from openrlhf_hacpo.engines import HFGenerateEngine, SamplingConfig
from openrlhf_hacpo.utils.pass_at_k import pass_at_k

__all__ = ["EvalResult", "generate_responses", "evaluate_accuracy", "pass_at_k"]


@dataclasses.dataclass
class EvalResult:
    accuracy: float
    """Greedy accuracy over all problems."""
    per_level: dict[int, float]
    """Greedy accuracy per level."""
    num_problems: int
    responses: list[str]
    """Greedy response texts (special tokens removed), in problem order."""
    sample_accuracy: float | None = None
    pass_at_k: dict[int, float] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict:
        out = {"accuracy": self.accuracy, "per_level": self.per_level, "num_problems": self.num_problems}
        if self.sample_accuracy is not None:
            out["sample_accuracy"] = self.sample_accuracy
            out["pass_at_k"] = self.pass_at_k
        return out


def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    num_return_sequences: int = 1,
    max_new_tokens: int = 40,
    batch_size: int = 256,
    seed: int | None = None,
) -> list[list[str]]:
    """Responses per problem (``num_return_sequences`` each) to the chat-template-rendered prompts.

    Generation is the rollout engine's (:class:`~openrlhf_hacpo.engines.HFGenerateEngine`: left padding, cut after
    the first EOS, special tokens removed from the text), ``batch_size`` problems (``batch_size *
    num_return_sequences`` rows) per ``generate`` call. Greedy unless
    ``do_sample``; sampling is at ``temperature`` with no top-k / top-p, from ``torch.manual_seed(seed)`` under a
    forked RNG when ``seed`` is given, else from the caller's random state."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not problems:
        return []
    sampling = SamplingConfig(n=num_return_sequences, greedy=not do_sample, temperature=temperature, top_p=1.0,
                              top_k=-1, max_new_tokens=max_new_tokens, seed=seed)
    prompts = tokenizer.apply_chat_template([p.messages for p in problems], add_generation_prompt=True,
                                            tokenize=False)
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
    n = num_return_sequences
    outputs = HFGenerateEngine(model, tokenizer, max_batch_size=batch_size * n).generate(prompt_ids, sampling)
    return [[o.response_text for o in outputs[i * n : (i + 1) * n]] for i in range(len(problems))]


def evaluate_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    num_samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 40,
    batch_size: int = 256,
) -> EvalResult:
    """Greedy accuracy (overall and per level) and, with ``num_samples > 0``, sample accuracy and pass@k."""
    if not problems:
        raise ValueError("evaluate_accuracy needs at least one problem")
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    greedy = [r[0] for r in generate_responses(
        model, tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size
    )]
    correct = [arithmetic_reward(r, p.label) for r, p in zip(greedy, problems)]
    by_level: dict[int, list[float]] = defaultdict(list)
    for p, c in zip(problems, correct):
        by_level[p.level].append(c)
    result = EvalResult(
        accuracy=sum(correct) / len(problems),
        per_level={lv: sum(v) / len(v) for lv, v in sorted(by_level.items())},
        num_problems=len(problems),
        responses=greedy,
    )
    if num_samples:
        sampled = generate_responses(model, tokenizer, problems, do_sample=True, temperature=temperature,
                                     num_return_sequences=num_samples, max_new_tokens=max_new_tokens,
                                     batch_size=max(1, batch_size // num_samples), seed=seed)
        n_correct = [sum(arithmetic_reward(r, p.label) for r in rs) for rs, p in zip(sampled, problems)]
        result.sample_accuracy = sum(n_correct) / (num_samples * len(problems))
        result.pass_at_k = {
            k: sum(pass_at_k(num_samples, int(c), k) for c in n_correct) / len(problems)
            for k in range(1, num_samples + 1)
        }
    return result
