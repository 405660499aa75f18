"""Cheap checks of an agent's local model folder against its config and tokenizer, before any worker loads it.

Only ``config.json`` (already parsed by the caller), the tokenizer and the safetensors headers are read; no weight is
loaded. A folder that fails here would otherwise fail late (a shape mismatch in ``from_pretrained`` inside every
worker) or silently (token ids past the end of the embedding: a wrong row on CPU, a device-side assert on GPU):

* the folder holds weights (``model.safetensors``, a sharded safetensors index, or ``pytorch_model.bin`` files),
  and every safetensors file named by an index exists and has a readable header;
* the input embedding and the LM head in the safetensors headers have the shape the config gives,
  ``vocab_size × hidden_size``;
* the tokenizer's token ids fit the embedding: ``len(tokenizer) <= vocab_size``.

Errors are ``ValueError`` / ``FileNotFoundError`` naming the agent, the folder and the file at fault.
"""
from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["EMBEDDING_SUFFIXES", "check_model_folder", "safetensors_shapes"]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "lm_head.weight")
"""Tensor names (by suffix) whose shape is ``vocab_size × hidden_size`` in the common causal-LM families."""


def safetensors_shapes(path: str, owner: str) -> dict[str, list[int]]:
    """``{tensor name: shape}`` from the header of the safetensors file ``path`` (no tensor data is read)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as err:  # SafetensorError (a damaged header), OSError
        raise ValueError(f"{owner}: weights file {path} is not a readable safetensors file "
                         f"({type(err).__name__}: {err})") from None


def _weight_files(folder: str, owner: str) -> list[str] | None:
    """The folder's safetensors files; None when it holds only ``pytorch_model.bin`` weights (not inspected)."""
    single = os.path.join(folder, SAFETENSORS)
    if os.path.isfile(single):
        return [single]
    index = os.path.join(folder, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise ValueError(f"{owner}: {index} is not a safetensors index (a JSON object with a 'weight_map' of "
                             f"tensor name to file; {type(err).__name__}: {err})") from None
        if not shards or not all(isinstance(s, str) for s in shards):
            raise ValueError(f"{owner}: {index} names no weight files")
        files = [os.path.join(folder, shard) for shard in shards]
        missing = [shard for shard, file in zip(shards, files) if not os.path.isfile(file)]
        if missing:
            raise FileNotFoundError(f"{owner}: {index} names weight files that are missing from {folder}: {missing}")
        return files
    if any(os.path.isfile(os.path.join(folder, name)) for name in TORCH_WEIGHTS):
        return None
    raise FileNotFoundError(f"{owner}: model folder {folder} holds no weights ({SAFETENSORS}, {SAFETENSORS_INDEX} "
                            f"or {TORCH_WEIGHTS[0]})")


def _int_setting(config: Any, name: str, owner: str, folder: str) -> int | None:
    value = getattr(config, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {folder}/config.json: {name} must be a positive int, got {value!r}")
    return value


def check_model_folder(folder: str, config: Any, tokenizer: Any, owner: str) -> None:
    """Check the local model ``folder`` against its parsed ``config`` (``transformers.PretrainedConfig``) and the
    agent's ``tokenizer`` (see the module docstring); ``owner`` (e.g. ``"agent 'qwen'"``) starts every error."""
    text_config = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    vocab_size = _int_setting(text_config, "vocab_size", owner, folder)
    hidden_size = _int_setting(text_config, "hidden_size", owner, folder)
    files = _weight_files(folder, owner)
    for file in files or ():
        for name, shape in safetensors_shapes(file, owner).items():
            if not name.endswith(EMBEDDING_SUFFIXES) or vocab_size is None or hidden_size is None:
                continue
            if shape != [vocab_size, hidden_size]:
                raise ValueError(
                    f"{owner}: tensor {name} in {file} has shape {shape}, but {folder}/config.json gives vocab_size "
                    f"{vocab_size} × hidden_size {hidden_size}: the weights belong to another model configuration")
    if vocab_size is not None and tokenizer is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"{owner}: the tokenizer has {len(tokenizer)} tokens but the model in {folder} embeds only vocab_size "
            f"{vocab_size}: token ids >= {vocab_size} have no embedding row (use the model's own tokenizer)")
