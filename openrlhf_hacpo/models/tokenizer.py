"""Loading an agent's tokenizer: its chat-template override applied, a pad token guaranteed."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["load_tokenizer", "looks_like_local_path"]


def looks_like_local_path(path: str) -> bool:
    """A filesystem path rather than a hub id (absolute, relative with ./ or ../, or home-relative)."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def load_tokenizer(path: str, chat_template: str | None = None, *, owner: str = "tokenizer"):
    """The tokenizer at ``path`` with ``chat_template`` (a template string or a file holding one) applied.

    A tokenizer without a pad token pads with its EOS token (padding is always masked). Errors start with
    ``owner`` (e.g. ``"agent 'llama'"``) and name the path.
    """
    from transformers import AutoTokenizer

    if looks_like_local_path(path) and not os.path.exists(path):
        raise FileNotFoundError(f"{owner}: tokenizer path {path!r} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # OSError, ValueError, or KeyError / AttributeError from damaged tokenizer files
        raise FileNotFoundError(f"{owner}: cannot load the tokenizer from {path!r}: {type(err).__name__}: "
                                f"{err}") from err
    if chat_template is not None:
        template = chat_template
        if os.path.isfile(template):
            try:
                template = Path(template).read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{owner}: chat template file {template}: byte 0x{err.object[err.start]:02x} at "
                                 f"offset {err.start} is not valid UTF-8") from None
        tokenizer.chat_template = template
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{owner}: tokenizer {path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
