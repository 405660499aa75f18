"""The rollout-engine contract shared by every generation backend.

A rollout engine turns tokenized prompts into sampled responses. Two backends implement it:
`HFGenerateEngine` (transformers `generate`, runs inside the policy actor) and `VLLMEngine` (a vLLM `LLM`, usually
inside its own Ray actor). Both take a `SamplingConfig`, return one `GenerationOutput` per response in the same
prompt-major order, and accept new weights through `update_weights`.
"""
from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

import torch

from openrlhf_hacpo.utils.seeding import derive_seed

FinishReason = Literal["stop", "length"]
NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample responses.

    Attributes:
        n: responses per prompt.
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 or 0 disables it.
        max_new_tokens: hard cap on response length (tokens, EOS included).
        seed: seed of this call. `None` uses the backend's running random state (not reproducible). A trainer that
            wants a reproducible run passes a derived seed per step (`for_step`; the HACPO trainer derives one per
            step and agent).
        stop_at_eos: stop a response at its first EOS token (the EOS is kept in the token ids). `False` makes every
            response exactly `max_new_tokens` long.
        greedy: take the argmax at every step regardless of temperature / top_p / top_k.
        return_logprobs: also return, per response token, its log-probability under the model's unmodified
            distribution (temperature 1, no top-k / top-p), i.e. vLLM's "raw_logprobs".
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    seed: int | None = None
    stop_at_eos: bool = True
    greedy: bool = False
    return_logprobs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingConfig.n must be a positive int, got {self.n!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0.0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k must be -1, 0 (disabled) or a positive int, got {self.top_k!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"SamplingConfig.seed must be None or a non-negative int, got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        """True when decoding is argmax: `greedy=True` or temperature 0."""
        return self.greedy or self.temperature == 0.0

    @property
    def effective_top_k(self) -> int:
        """top_k with both "disabled" spellings (-1 and 0) mapped to 0."""
        return max(self.top_k, 0)

    def for_step(self, run_seed: int, step: int) -> "SamplingConfig":
        """This config with `seed = derive_seed(run_seed, step)`: one reproducible stream per training step."""
        return replace(self, seed=derive_seed(run_seed, step))


@dataclass
class GenerationOutput:
    """One sampled response.

    Attributes:
        prompt_index: index of the prompt in the `generate` call.
        sample_index: 0..n-1 among that prompt's responses.
        response_token_ids: generated ids; the terminating EOS is included when one was emitted, nothing after it.
        response_text: `tokenizer.decode(response_token_ids, skip_special_tokens=True)`.
        finished: the response ended with an EOS token.
        finish_reason: "stop" (EOS emitted) or "length" (hit `max_new_tokens` or the engine's context limit).
        logprobs: per-token log-probabilities of `response_token_ids` (see `SamplingConfig.return_logprobs`).
    """

    prompt_index: int
    sample_index: int
    response_token_ids: list[int]
    response_text: str
    finished: bool
    finish_reason: FinishReason
    logprobs: list[float] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.response_token_ids)

    def to_dict(self) -> dict:
        return {
            "prompt_index": self.prompt_index,
            "sample_index": self.sample_index,
            "response_token_ids": list(self.response_token_ids),
            "response_text": self.response_text,
            "finished": self.finished,
            "finish_reason": self.finish_reason,
            "logprobs": None if self.logprobs is None else list(self.logprobs),
        }


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs from a generation backend."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """`sampling.n` outputs per prompt, ordered prompt-major: output `i * n + s` is sample `s` of prompt `i`."""
        ...

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load new weights, given by the HF parameter names of the policy model."""
        ...


def validate_prompts(prompt_token_ids: Sequence[Sequence[int]], vocab_size: int | None = None) -> list[list[int]]:
    """Check a batch of tokenized prompts and return it as plain lists of ints.

    Raises ValueError naming the first bad prompt: empty batch, empty prompt, non-integer or out-of-vocabulary ids.
    """
    if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
        raise ValueError(f"prompt_token_ids must be a list of token-id lists, got {type(prompt_token_ids).__name__}")
    if len(prompt_token_ids) == 0:
        raise ValueError("prompt_token_ids is empty: nothing to generate")
    prompts: list[list[int]] = []
    for index, prompt in enumerate(prompt_token_ids):
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompt {index} must be a list of token ids, got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty")
        ids = []
        for token in prompt:
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise ValueError(f"prompt {index} holds a non-integer token id {token!r}")
            if token < 0 or (vocab_size is not None and token >= vocab_size):
                raise ValueError(f"prompt {index} holds token id {token}, outside the vocabulary [0, {vocab_size})")
            ids.append(int(token))
        prompts.append(ids)
    return prompts


def iter_named_tensors(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """Accept a mapping or an iterable of (name, tensor) pairs; yield the pairs."""
    if isinstance(named_tensors, Mapping):
        return named_tensors.items()
    return named_tensors


def cut_at_eos(token_ids: Sequence[int], eos_token_ids: Iterable[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS. Returns (ids, ended_with_eos)."""
    eos = set(eos_token_ids)
    for position, token in enumerate(token_ids):
        if token in eos:
            return list(token_ids[: position + 1]), True
    return list(token_ids), False
