"""Tokenizers of the tiny agents, built with `tokenizers` and wrapped as Hugging Face fast tokenizers.

* ``char`` (Llama-style agent): one id per character of the task alphabet, plus ``<pad>``, ``<s>`` (BOS),
  ``</s>`` (EOS) and ``<unk>``. Chat template: ``<s>`` + the user message + ``"\\nA: "``; an assistant turn ends
  with ``</s>``.
* ``bpe`` (Qwen3-style agent): byte-level BPE trained in memory on task text. As in Qwen's tokenizer, digits are
  split one per token before BPE and ``\\n`` is its own piece; merges therefore only join non-digit runs (``"Q: "``,
  ``" ="``, ``"=?"``, ``"user"``, ...). ChatML template with ``<|im_start|>``/``<|im_end|>``; EOS is
  ``<|im_end|>`` and PAD is ``<|endoftext|>``; there is no BOS.

Both render ``[{"role": "user", "content": "Q: 347+285=?"}]`` with ``apply_chat_template(messages,
add_generation_prompt=True, tokenize=False)``, save with ``save_pretrained`` and load offline with
``AutoTokenizer.from_pretrained``.
"""
from __future__ import annotations

import random
import re

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from openrlhf_hacpo.data.arithmetic import LEVELS, random_problem, response_text

__all__ = [
    "TOKENIZER_KINDS",
    "CHAR_ALPHABET",
    "CHAR_CHAT_TEMPLATE",
    "CHATML_TEMPLATE",
    "build_char_tokenizer",
    "build_bpe_tokenizer",
    "build_tokenizer",
    "bpe_training_corpus",
]

TOKENIZER_KINDS = ("char", "bpe")
MODEL_MAX_LENGTH = 128

CHAR_ALPHABET = "0123456789+-=?QA: \n"
"""Every character of the task's prompts, responses and the char chat template."""
CHAR_SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}

CHAR_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'A: ' + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ raise_exception('the char chat template supports user and assistant turns, got ' "
    "+ message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"
)

CHATML_SPECIALS = {"pad": "<|endoftext|>", "im_start": "<|im_start|>", "eos": "<|im_end|>"}
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _wrap(tokenizer: Tokenizer, chat_template: str, **special_tokens: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        chat_template=chat_template,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        **special_tokens,
    )


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over :data:`CHAR_ALPHABET` (ids 0-3 are pad, bos, eos, unk)."""
    symbols = list(CHAR_SPECIALS.values()) + list(CHAR_ALPHABET)
    tok = Tokenizer(models.WordLevel(vocab={s: i for i, s in enumerate(symbols)}, unk_token=CHAR_SPECIALS["unk"]))
    tok.add_special_tokens(list(CHAR_SPECIALS.values()))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # join pieces without separators
    return _wrap(
        tok,
        CHAR_CHAT_TEMPLATE,
        pad_token=CHAR_SPECIALS["pad"],
        bos_token=CHAR_SPECIALS["bos"],
        eos_token=CHAR_SPECIALS["eos"],
        unk_token=CHAR_SPECIALS["unk"],
    )


def bpe_training_corpus(num_problems: int = 4000, seed: int = 0) -> list[str]:
    """Task text the BPE tokenizer is trained on: ChatML-rendered problems of every level in both response
    formats, with the special tokens cut out (BPE training does not see added tokens)."""
    rng = random.Random(f"bpe-corpus:{seed}")
    levels = sorted(LEVELS)
    specials = re.compile("|".join(re.escape(s) for s in CHATML_SPECIALS.values()))
    corpus = []
    for i in range(num_problems):
        problem = random_problem(levels[i % len(levels)], rng)
        for fmt in ("worked", "answer"):
            text = (
                f"<|im_start|>user\n{problem.question}<|im_end|>\n"
                f"<|im_start|>assistant\n{response_text(problem, fmt)}<|im_end|>\n"
            )
            corpus.extend(piece for piece in specials.split(text) if piece)
    return corpus


def build_bpe_tokenizer(
    vocab_size: int = 320, num_corpus_problems: int = 4000, seed: int = 0
) -> PreTrainedTokenizerFast:
    """Byte-level BPE (full 256-byte alphabet, so no text is ever lost) trained on :func:`bpe_training_corpus`.

    ``vocab_size`` is an upper bound: merges stop when no pair occurs twice, which on this corpus happens well
    before 320 (about 256 bytes + 3 specials + a dozen merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(CHATML_SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(bpe_training_corpus(num_corpus_problems, seed), trainer)
    return _wrap(tok, CHATML_TEMPLATE, pad_token=CHATML_SPECIALS["pad"], eos_token=CHATML_SPECIALS["eos"])


def build_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """The tokenizer of ``kind`` (``"char"`` or ``"bpe"``); deterministic."""
    if kind == "char":
        return build_char_tokenizer()
    if kind == "bpe":
        return build_bpe_tokenizer()
    raise ValueError(f"tokenizer kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
