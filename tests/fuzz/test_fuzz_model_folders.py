"""Fuzzing the agents' model folders as the run checks them before any worker starts
(:func:`~openrlhf_hacpo.trainer.run_inputs.check_run_inputs` and
:func:`~openrlhf_hacpo.trainer.model_folder.check_model_folder`): missing files, damaged weights headers, weights
of another shape than ``config.json`` gives, a tokenizer with more tokens than the embedding has rows.

Property: a folder passes exactly when config, weights and tokenizer agree (decided here by hand from the shapes
written), and otherwise the error names the agent and the folder or file at fault; never a raw exception. Only
``config.json``, the tokenizer files and the safetensors header are read.
"""
from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz_support import fuzz, message_names

_COUNTER = itertools.count()
OWNER = "agent 'probe'"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "head_dim": 16,
          "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 1,
          "max_position_embeddings": 64, "vocab_size": 23, "tie_word_embeddings": True, "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The zoo's character tokenizer (23 tokens), saved once."""
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = build_tokenizer("char")
    tokenizer.save_pretrained(folder)
    return folder


def _write_folder(root, tokenizer_dir, vocab: int, hidden: int, weight_shape: tuple[int, int], *, head: bool = False,
                  drop: tuple[str, ...] = ()):
    from safetensors.numpy import save_file

    folder = root / f"model{next(_COUNTER)}"
    shutil.copytree(tokenizer_dir, folder)
    (folder / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": vocab, "hidden_size": hidden}))
    tensors = {"model.embed_tokens.weight": np.zeros(weight_shape, np.float32),
               "model.norm.weight": np.ones(hidden, np.float32)}
    if head:
        tensors["lm_head.weight"] = np.zeros(weight_shape, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    for name in drop:
        (folder / name).unlink()
    return folder


def _check(folder):
    from transformers import AutoConfig

    from openrlhf_hacpo.models.tokenizer import load_tokenizer
    from openrlhf_hacpo.trainer.model_folder import check_model_folder

    tokenizer = load_tokenizer(str(folder), owner=OWNER)
    check_model_folder(str(folder), AutoConfig.from_pretrained(folder), tokenizer, OWNER)
    return len(tokenizer)


@given(vocab=st.integers(1, 64), hidden=st.sampled_from([16, 32, 48]), rows=st.integers(1, 64),
       cols=st.sampled_from([16, 32, 48]), head=st.booleans())
@example(vocab=23, hidden=32, rows=23, cols=16, head=False)  # config says hidden 32, weights 16
@example(vocab=16, hidden=32, rows=16, cols=32, head=False)  # 23 tokens, 16 embedding rows
@fuzz(0.5)
def test_shapes_and_vocabulary_agree_or_the_folder_is_named(tmp_path_factory, tokenizer_dir, vocab, hidden, rows,
                                                             cols, head):
    folder = _write_folder(tmp_path_factory.mktemp("f"), tokenizer_dir, vocab, hidden, (rows, cols), head=head)
    tokens = 23  # the char tokenizer
    agree = (rows, cols) == (vocab, hidden) and tokens <= vocab
    try:
        _check(folder)
    except ValueError as err:
        assert not agree, f"a consistent folder was refused: {err}"
        message_names(err, OWNER, folder)
        if (rows, cols) != (vocab, hidden):
            message_names(err, folder / "model.safetensors", f"[{rows}, {cols}]")
        else:
            message_names(err, "tokenizer has 23 tokens", f"vocab_size {vocab}")
        return
    assert agree, f"shapes {(rows, cols)} vs config {(vocab, hidden)}, {tokens} tokens: accepted"


@given(header=st.binary(max_size=64), keep=st.integers(0, 200))
@example(header=b"\xff" * 8, keep=0)
@fuzz(0.5)
def test_a_damaged_weights_file_is_named(tmp_path_factory, tokenizer_dir, header, keep):
    folder = _write_folder(tmp_path_factory.mktemp("f"), tokenizer_dir, 23, 32, (23, 32))
    weights = folder / "model.safetensors"
    weights.write_bytes(header + weights.read_bytes()[len(header):][:keep])  # overwritten head, cut tail
    with pytest.raises(ValueError) as info:
        _check(folder)
    message_names(info.value, OWNER, weights, "not a readable safetensors file")


@pytest.mark.parametrize("index, problem", [
    ({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}, "missing"),
    ({"weights": {}}, "not a safetensors index"),
    ([1, 2], "not a safetensors index"),
    ({"weight_map": {}}, "names no weight files"),
])
def test_a_sharded_index_that_names_missing_files_is_named(tmp_path, tokenizer_dir, index, problem):
    folder = _write_folder(tmp_path, tokenizer_dir, 23, 32, (23, 32), drop=("model.safetensors",))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        _check(folder)
    message_names(info.value, OWNER, "model.safetensors.index.json", problem)


def test_a_sharded_folder_is_checked_shard_by_shard(tmp_path, tokenizer_dir):
    from safetensors.numpy import save_file

    folder = _write_folder(tmp_path, tokenizer_dir, 23, 32, (23, 32), drop=("model.safetensors",))
    save_file({"model.norm.weight": np.ones(32, np.float32)}, str(folder / "a.safetensors"))
    save_file({"model.embed_tokens.weight": np.zeros((23, 16), np.float32)}, str(folder / "b.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "a.safetensors", "model.embed_tokens.weight": "b.safetensors"}}))
    with pytest.raises(ValueError) as info:
        _check(folder)
    message_names(info.value, OWNER, folder / "b.safetensors", "[23, 16]", "hidden_size 32")


FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _run_config(root, folder):
    """A one-agent run of ``folder`` on four prompts written under ``root``."""
    from openrlhf_hacpo.cli.train_hacpo import build_config

    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"{i}+{i}=", "label": str(2 * i)}) + "\n" for i in range(4)))
    return build_config(["--agent", f"name=probe,pretrain={folder}", "--prompt_data", str(prompts),
                         "--reward_fn", "exact_match", "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
                         "--train_batch_size", "4", "--micro_train_batch_size", "2", "--no_ray",
                         "--save_path", str(root / "run")])


@given(drop=st.sets(st.sampled_from(FILES), min_size=1))
@example(drop={"model.safetensors"})
@fuzz(0.3)
def test_missing_files_fail_before_any_worker_naming_the_agent(tmp_path_factory, tokenizer_dir, drop):
    """The whole pre-run check (:func:`check_run_inputs`) on a folder without some of its files."""
    from openrlhf_hacpo.trainer.run_inputs import check_run_inputs

    root = tmp_path_factory.mktemp("run")
    folder = _write_folder(root, tokenizer_dir, 23, 32, (23, 32), drop=tuple(sorted(drop)))
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        check_run_inputs(_run_config(root, folder))
    message_names(info.value, OWNER, folder)


def test_a_consistent_folder_passes_the_whole_pre_run_check(tmp_path, tokenizer_dir):
    from openrlhf_hacpo.trainer.run_inputs import check_run_inputs

    folder = _write_folder(tmp_path, tokenizer_dir, 23, 32, (23, 32))
    loader, eval_records = check_run_inputs(_run_config(tmp_path, folder))
    assert len(loader.records) == 4 and eval_records is None


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 100) | st.floats(allow_nan=False)
                           | st.text(max_size=5), lambda inner: st.lists(inner, max_size=2)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=2), max_leaves=4)


@st.composite
def damaged_file(draw):
    """(file name, new bytes): config.json with one setting replaced, or a tokenizer file / config.json replaced by
    any JSON value or bytes."""
    name = draw(st.sampled_from(["config.json", "tokenizer.json", "tokenizer_config.json"]))
    how = draw(st.sampled_from(["setting", "json", "bytes"]) if name == "config.json"
               else st.sampled_from(["json", "bytes"]))
    if how == "setting":
        key = draw(st.sampled_from(sorted(CONFIG)))
        return name, json.dumps({**CONFIG, key: draw(JSON_VALUES)}).encode()
    if how == "json":
        return name, json.dumps(draw(JSON_VALUES)).encode()
    return name, draw(st.binary(max_size=40))


@given(damage=damaged_file())
@example(damage=("tokenizer.json", b"{}"))  # used to be a raw KeyError
@example(damage=("tokenizer_config.json", b"[1]"))  # used to be a raw AttributeError
@example(damage=("config.json", json.dumps({**CONFIG, "hidden_size": "abc"}).encode()))  # huggingface_hub's error
@example(damage=("config.json", json.dumps({**CONFIG, "vocab_size": -5}).encode()))  # accepted by transformers
@fuzz(0.5)
def test_damaged_config_and_tokenizer_files_name_the_agent(tmp_path_factory, tokenizer_dir, damage):
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.trainer.run_inputs import check_run_inputs

    root = tmp_path_factory.mktemp("run")
    folder = _write_folder(root, tokenizer_dir, 23, 32, (23, 32))
    name, data = damage
    (folder / name).write_bytes(data)
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"{i}+{i}=", "label": str(2 * i)}) + "\n" for i in range(4)))
    cfg = build_config(["--agent", f"name=probe,pretrain={folder}", "--prompt_data", str(prompts),
                        "--reward_fn", "exact_match", "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
                        "--train_batch_size", "4", "--micro_train_batch_size", "2", "--no_ray",
                        "--save_path", str(root / "run")])
    try:
        check_run_inputs(cfg)
    except (ValueError, FileNotFoundError) as err:
        message_names(err, OWNER)
