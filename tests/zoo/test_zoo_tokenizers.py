"""Tokenizers: chat templates, EOS, round trips, Qwen-style digit splitting, offline save/load."""
import pytest
from transformers import AutoTokenizer

from openrlhf_hacpo.data.arithmetic import LEVELS, response_text, sample_problems
from openrlhf_hacpo.zoo.tokenizers import CHAR_ALPHABET, build_bpe_tokenizer, build_char_tokenizer, build_tokenizer

MESSAGES = [{"role": "user", "content": "Q: 347+285=?"}]
EXPECTED_PROMPT = {
    "char": "<s>Q: 347+285=?\nA: ",
    "bpe": "<|im_start|>user\nQ: 347+285=?<|im_end|>\n<|im_start|>assistant\n",
}
EXPECTED_SPECIALS = {  # (eos, pad, bos)
    "char": ("</s>", "<pad>", "<s>"),
    "bpe": ("<|im_end|>", "<|endoftext|>", None),
}


@pytest.fixture(scope="module", params=["char", "bpe"])
def kind_and_tokenizer(request):
    return request.param, build_tokenizer(request.param)


def _task_strings():
    problems = sample_problems(sorted(LEVELS), 200, seed=11)
    for p in problems:
        yield p.question
        yield p.prompt_text
        yield response_text(p, "worked")
        yield response_text(p, "answer")


def test_chat_template_renders_prompt(kind_and_tokenizer):
    kind, tok = kind_and_tokenizer
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == EXPECTED_PROMPT[kind]
    eos, pad, bos = EXPECTED_SPECIALS[kind]
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (eos, pad, bos)
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.convert_ids_to_tokens(tok.encode(eos, add_special_tokens=False)) == [eos], "EOS is one token"
    full = tok.apply_chat_template(MESSAGES + [{"role": "assistant", "content": "5+7=12 =12"}], tokenize=False)
    assert full.startswith(EXPECTED_PROMPT[kind]) and "5+7=12 =12" + eos in full


def test_round_trip_task_strings(kind_and_tokenizer):
    _, tok = kind_and_tokenizer
    for text in _task_strings():
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=True) == text
        assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
        assert tok.unk_token_id not in ids or tok.unk_token_id is None


def test_worked_response_length(kind_and_tokenizer):
    _, tok = kind_and_tokenizer
    n = len(tok.encode("7+5=12 4+8+1=13 3+2+1=6 =632", add_special_tokens=False))
    assert 25 <= n <= 28  # one token per character, except BPE's " =" merge


def test_save_load_offline(kind_and_tokenizer, tmp_path):
    kind, tok = kind_and_tokenizer
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == EXPECTED_PROMPT[kind]
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token_id) == (
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token_id,
    )
    for text in list(_task_strings())[:80]:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert loaded.get_vocab() == tok.get_vocab()


def test_char_tokenizer_is_one_id_per_character():
    tok = build_char_tokenizer()
    assert len(tok) == 4 + len(CHAR_ALPHABET)
    assert tok.convert_ids_to_tokens(tok.encode("Q: 12+3=?\nA: ", add_special_tokens=False)) == list("Q: 12+3=?\nA: ")
    assert tok.encode("x", add_special_tokens=False) == [tok.unk_token_id]
    with pytest.raises(Exception, match="user and assistant"):
        tok.apply_chat_template([{"role": "system", "content": "hi"}], tokenize=False)


def test_bpe_splits_digits_and_newlines_like_qwen():
    tok = build_bpe_tokenizer()
    for token in tok.get_vocab():
        text = tok.convert_tokens_to_string([token])
        if any(c.isdigit() for c in text) or "\n" in text:
            assert len(text) == 1, f"token {token!r} merges a digit or newline"
    pieces = tok.convert_ids_to_tokens(tok.encode(" =632", add_special_tokens=False))
    assert [tok.convert_tokens_to_string([p]) for p in pieces] == [" =", "6", "3", "2"]
    odd = "héllo ünïcode ✓ xyz"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd, "byte-level BPE never drops text"


def test_bpe_training_is_deterministic():
    assert build_bpe_tokenizer().get_vocab() == build_bpe_tokenizer().get_vocab()


def test_unknown_kind():
    with pytest.raises(ValueError, match="tokenizer kind"):
        build_tokenizer("sentencepiece")
