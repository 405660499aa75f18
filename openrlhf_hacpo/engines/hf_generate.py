"""Rollout engine on transformers `generate`, for models small enough to sample inside the policy actor.

Prompts are left-padded into batches with an explicit attention mask (transformers derives the position ids from
it), sampled with the model's KV cache, and cut after the first EOS. A seeded call runs under a forked torch RNG, so
it is reproducible and leaves the caller's random state untouched.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from openrlhf_hacpo.engines.base import (
    GenerationOutput,
    NamedTensors,
    SamplingConfig,
    cut_at_eos,
    iter_named_tensors,
    validate_prompts,
)

GENERATE_BATCH_ROWS = 64
"""Rows (prompt x sample) per ``generate`` call of the trainer's engines (the policy's in the ``hf`` backend, an
``HFEngine``'s in ``hf_engine``): the tokens of a seeded call depend on how its rows are cut into batches, so both
cut them alike, whatever the training batch sizes."""

# Sampling knobs a checkpoint's generation_config.json may set. transformers fills every field we leave as None from
# the model's generation config, so each one is pinned to its neutral value: the sampling is exactly what the
# SamplingConfig says, for any checkpoint.
_NEUTRAL_GENERATION_FIELDS = dict(
    num_beams=1,
    num_return_sequences=1,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    typical_p=1.0,
    min_new_tokens=0,
    use_cache=True,
)
# Applied only when sampling; pinned then (greedy decoding ignores them, and transformers warns when they are set).
_NEUTRAL_SAMPLING_FIELDS = dict(epsilon_cutoff=0.0, eta_cutoff=0.0, min_p=0.0)


def resolve_eos_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's EOS plus every id in the model's generation config (Qwen-style lists included).

    This is the set vLLM stops on as well (tokenizer EOS + generation-config `eos_token_id`).
    """
    ids: list[int] = []
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        candidates.append(generation_config.eos_token_id)
    for candidate in candidates:
        if candidate is None:
            continue
        for token in [candidate] if isinstance(candidate, int) else list(candidate):
            if int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the model's generation config names none")
    return ids


class _RawLogprobRecorder(LogitsProcessor):
    """Records, for every sampled token, its log-probability under the raw (temperature-1, untruncated) logits.

    transformers runs user logits processors before temperature / top-k / top-p, so `scores` here are the model's
    logits. The token sampled from step t's distribution is only known at step t+1 (as the last input id), so each
    call scores the previous step's token and keeps the current distribution for the next call; `finish` scores the
    last token. Memory: one [batch, vocab] tensor, whatever the response length.
    """

    def __init__(self) -> None:
        self.per_step: list[torch.Tensor] = []
        self._previous: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.per_step.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor, num_generated: int) -> torch.Tensor:
        """[batch, num_generated] log-probs of the generated tokens in `sequences`."""
        # generate() may run one step past the last kept token and drop it; then per_step already covers it.
        if len(self.per_step) < num_generated and self._previous is not None:
            self.per_step.append(self._previous.gather(-1, sequences[:, -1:]).squeeze(-1))
        if num_generated == 0:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.per_step[:num_generated], dim=1)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run the block from `torch.manual_seed(seed)` and restore the caller's RNG state afterwards."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class HFGenerateEngine:
    """`RolloutEngine` on `model.generate`.

    Args:
        model: an HF causal LM. When it is the policy's own module object the engine always samples from the current
            weights and `update_weights` has nothing to copy.
        tokenizer: the model's tokenizer (EOS / pad ids, decoding).
        max_batch_size: rows (prompt x sample) per `generate` call; larger batches are chunked.
        eos_token_ids: stop ids; default `resolve_eos_token_ids(model, tokenizer)`.
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64, eos_token_ids: Sequence[int] | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be positive, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        if eos_token_ids is None:
            eos_token_ids = resolve_eos_token_ids(model, tokenizer)
        self.eos_token_ids = [int(token) for token in eos_token_ids]
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids is empty")
        pad = getattr(tokenizer, "pad_token_id", None)
        # Padding sits left of the prompt (masked) or after a finished response's EOS (cut), so any id works.
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[GenerationOutput]:
        """`sampling.n` responses per prompt, prompt-major (output `i * n + s` is sample `s` of prompt `i`)."""
        prompts = validate_prompts(prompt_token_ids, vocab_size=self.vocab_size)
        rows = [(index, sample) for index in range(len(prompts)) for sample in range(sampling.n)]
        generation_config = self._generation_config(sampling)
        was_training = self.model.training
        self.model.eval()
        outputs: list[GenerationOutput] = []
        try:
            with torch.no_grad(), _seeded(sampling.seed, self.device):
                for start in range(0, len(rows), self.max_batch_size):
                    chunk = rows[start : start + self.max_batch_size]
                    outputs.extend(self._generate_chunk(prompts, chunk, generation_config, sampling))
        finally:
            self.model.train(was_training)
        return outputs

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Copy the given tensors into the model. Tensors that already are the model's (shared storage) are skipped,
        so an engine built on the policy's own module object makes this a no-op.

        Raises KeyError for a name the model does not have and ValueError for a shape mismatch.
        """
        own = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in iter_named_tensors(named_tensors):
                if name not in own:
                    raise KeyError(f"update_weights: the model has no parameter or buffer named {name!r}")
                target = own[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                        f"the model expects {tuple(target.shape)}"
                    )
                if target.data_ptr() == tensor.data_ptr() and target.device == tensor.device:
                    continue
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    # ------------------------------------------------------------------ internals

    def _generation_config(self, sampling: SamplingConfig) -> GenerationConfig:
        if sampling.stop_at_eos:
            eos_token_id = list(self.eos_token_ids)
        else:
            # An id outside the vocabulary is never produced, so no row ever stops early; an unset eos_token_id
            # would be filled in from the model's generation config.
            eos_token_id = [self.vocab_size]
        fields = dict(
            _NEUTRAL_GENERATION_FIELDS,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=self.pad_token_id,
        )
        if sampling.is_greedy:
            fields.update(do_sample=False)
        else:
            fields.update(
                _NEUTRAL_SAMPLING_FIELDS,
                do_sample=True,
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                top_k=sampling.effective_top_k,
            )
        return GenerationConfig(**fields)

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        rows: list[tuple[int, int]],
        generation_config: GenerationConfig,
        sampling: SamplingConfig,
    ) -> list[GenerationOutput]:
        device = self.device
        width = max(len(prompts[index]) for index, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (index, _) in enumerate(rows):
            prompt = prompts[index]
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1

        recorder = _RawLogprobRecorder() if sampling.return_logprobs else None
        sequences = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=generation_config,
            logits_processor=LogitsProcessorList([recorder]) if recorder is not None else None,
        )
        generated = sequences[:, width:]
        logprobs = recorder.finish(sequences, generated.shape[1]).cpu() if recorder is not None else None
        generated = generated.cpu().tolist()

        stop_ids = self.eos_token_ids if sampling.stop_at_eos else []
        outputs = []
        for row, (index, sample) in enumerate(rows):
            ids, ended_with_eos = cut_at_eos(generated[row], stop_ids)
            outputs.append(
                GenerationOutput(
                    prompt_index=index,
                    sample_index=sample,
                    response_token_ids=ids,
                    response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finished=ended_with_eos,
                    finish_reason="stop" if ended_with_eos else "length",
                    logprobs=logprobs[row, : len(ids)].tolist() if logprobs is not None else None,
                )
            )
        return outputs
