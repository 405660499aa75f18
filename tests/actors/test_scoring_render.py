"""RolloutScorer.render: each prompt's chat template is applied once, the ids are that text's tokens, left-truncated."""
from types import SimpleNamespace

from openrlhf_hacpo.actors.scoring import RolloutScorer
from openrlhf_hacpo.config import AgentConfig, TrainConfig


class CountingTokenizer:
    """A chat template "<u>{content}</u>" and one id per character (by hand), counting template calls."""

    chat_template = "<u>{content}</u>"
    name_or_path = "counting"

    def __init__(self):
        self.template_calls = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        assert add_generation_prompt and not tokenize
        self.template_calls += 1
        return f"<u>{messages[-1]['content']}</u>"

    def __call__(self, text, add_special_tokens):
        assert not add_special_tokens  # the template owns the special tokens
        return {"input_ids": [ord(c) for c in text]}


def test_render_applies_the_template_once_and_left_truncates(tmp_path):
    cfg = TrainConfig.of(agents=[AgentConfig(name="a", pretrain="/m")], prompt_data="x.jsonl", save_path=str(tmp_path),
                      apply_chat_template=True, prompt_max_len=6)
    tok = CountingTokenizer()
    scorer = RolloutScorer(cfg, 0, tok, eos_token_ids=[0])
    prompts = [SimpleNamespace(prompt="1+2"), SimpleNamespace(prompt="30+4")]
    rendered = scorer.render(prompts)
    assert tok.template_calls == 2
    assert rendered.texts == ["<u>1+2</u>", "<u>30+4</u>"]
    # the last 6 characters' ids: "+2</u>" and "+4</u>"
    assert rendered.ids == [[ord(c) for c in "+2</u>"], [ord(c) for c in "+4</u>"]]
    assert rendered.ids == scorer.prompt_ids(prompts)  # the generation ids agree with the separate path
