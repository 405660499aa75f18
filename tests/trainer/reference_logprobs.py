"""float64 log-probs of a response under a Hugging Face model, computed outside the trainer's code path (shared by the
tests that check the trainer's and the engines' log-probs against them)."""
from __future__ import annotations

import torch


def prompt_ids(tokenizer, messages) -> list[int]:
    """The prompt's token ids as the trainer renders it: the chat template with the generation prompt, no thinking."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def sequence_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """float64 log softmax (temperature 1) of each response token given the prompt and the tokens before it."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].double()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()
