"""Tiny models, tokenizers and independent references for the engine tests, built in memory (no downloads)."""
from __future__ import annotations

import copy

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

CHAR_ALPHABET = list("0123456789+-=?QA: \n")
CHAR_SPECIALS = ["<pad>", "<s>", "</s>"]
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_CORPUS = [f"Q: {a}+{b}=?\nA: {a + b}" for a in range(0, 60, 3) for b in range(0, 40, 7)]


def make_char_tokenizer() -> PreTrainedTokenizerFast:
    """One id per character; decoding concatenates characters."""
    vocab = {token: index for index, token in enumerate(CHAR_SPECIALS + CHAR_ALPHABET)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def make_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few arithmetic strings, Qwen-style specials (EOS <|im_end|>, pad <|endoftext|>)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=BPE_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(BPE_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        clean_up_tokenization_spaces=False,
    )


def make_llama(tokenizer, seed: int = 0, hidden: int = 32) -> LlamaForCausalLM:
    """Random 2-layer Llama. head_dim 32 because vLLM's CPU attention supports head sizes >= 32."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


def make_qwen3(tokenizer, seed: int = 0) -> Qwen3ForCausalLM:
    """Random 2-layer Qwen3 (qk-norm, tied embeddings) whose generation config stops on two ids, as Qwen's does."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    return model


def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], list[float]]:
    """Greedy decoding by full forward passes (no KV cache, no padding). Also returns, per step, the margin between
    the best and the second-best logit, so callers can tell where a comparison is numerically meaningful."""
    ids = list(prompt)
    out, margins = [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top2 = torch.topk(logits, 2)
            token = int(top2.indices[0])
            out.append(token)
            margins.append(float(top2.values[0] - top2.values[1]))
            ids.append(token)
            if token in set(eos_ids):
                break
    return out, margins


def reference_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """log p(response_t | prompt, response_<t) by one teacher-forced float64 forward pass."""
    model64 = copy.deepcopy(model).double()
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model64(ids).logits[0].double(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logp[positions, torch.tensor(response)].tolist()


def reference_first_token_probs(model, prompt: list[int], temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Exact float64 distribution of the first sampled token: softmax(logits / T); top-k keeps the k most likely;
    top-p then keeps, on the renormalised top-k distribution, the most likely tokens until their mass reaches top_p."""
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        logits = model64(torch.tensor([prompt])).logits[0, -1].double()
    probs = torch.softmax(logits / temperature, dim=-1)
    order = torch.argsort(probs, descending=True).tolist()
    if top_k > 0:
        order = order[:top_k]
    candidates = probs[order] / probs[order].sum()
    kept, mass = [], 0.0
    for token, prob in zip(order, candidates.tolist()):
        if mass >= top_p:
            break
        kept.append(token)
        mass += prob
    result = torch.zeros_like(probs)
    result[kept] = probs[kept]
    return result / result.sum()


def sharpen(model, scale: float):
    """A copy of `model` whose output logits are `scale` times larger (a peaked, non-uniform distribution)."""
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(scale)
    return sharp
