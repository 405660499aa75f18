"""Two small tokenizers of different kinds, built in memory, for learner-view tests.

* :func:`char_tokenizer`: a character-level ``WordLevel`` model (one token per character), a BOS-adding
  post-processor, and a chat template that writes ``{{ bos_token }}`` itself (Llama style).
* :func:`bpe_tokenizer`: a byte-level BPE trained on a few sentences, no BOS, a ChatML template with ``<|im_end|>``
  as EOS (Qwen style).

Both are wrapped in ``PreTrainedTokenizerFast`` and round-trip any text made of their alphabet.
"""
from __future__ import annotations

import functools

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n.,!?+-*/=()[]{}\\:;'\"<>|_^$%"
CHAR_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAR_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
BPE_CORPUS = [
    "The answer is 5. What is 2+3? Let me think step by step.",
    "We add the numbers: 12 + 30 = 42, so the final answer is \\boxed{42}.",
    "hello world, numbers 0123456789 and some more words for merges",
]


@functools.lru_cache(maxsize=None)
def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(CHAR_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=CHAR_TEMPLATE,
        name_or_path="tiny-char",
    )


@functools.lru_cache(maxsize=None)
def bpe_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(BPE_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=BPE_TEMPLATE,
        name_or_path="tiny-bpe",
    )
