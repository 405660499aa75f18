"""Evaluation: batched left-padded greedy equals one-by-one greedy; accuracy / per-level / pass@k bookkeeping
against a scripted model and brute-force pass@k."""
import itertools

import pytest
import torch

from openrlhf_hacpo.data.arithmetic import Problem, response_text, sample_problems
from openrlhf_hacpo.zoo import evaluate_accuracy, generate_responses, load_agent
from openrlhf_hacpo.zoo.evaluate import pass_at_k
from openrlhf_hacpo.zoo.tokenizers import build_char_tokenizer


class ScriptedModel(torch.nn.Module):
    """Answers each prompt from a script: ``script[question] = list of responses`` (one per returned sequence).
    Checks that prompts arrive left-padded."""

    def __init__(self, tokenizer, script):
        super().__init__()
        self.tok, self.script = tokenizer, script
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def generate(self, input_ids, attention_mask, generation_config):
        assert (attention_mask[:, -1] == 1).all(), "prompts must be left-padded"
        n = generation_config.num_return_sequences
        rows = []
        for ids in input_ids:
            question = self.tok.decode(ids, skip_special_tokens=True).split("\n")[0]
            replies = self.script[question]
            assert len(replies) == n
            rows += [self.tok.encode(r, add_special_tokens=False) + [self.tok.eos_token_id] for r in replies]
        width = max(map(len, rows))
        new = torch.full((len(rows), width), self.tok.pad_token_id)
        for i, r in enumerate(rows):
            new[i, : len(r)] = torch.tensor(r)
        return torch.cat([input_ids.repeat_interleave(n, 0), new], dim=1)


def test_accuracy_and_per_level_from_scripted_answers():
    tok = build_char_tokenizer()
    problems = sample_problems([1, 2, 4], 12, seed=0)
    right = {p for i, p in enumerate(problems) if i % 3 != 0 or p.level == 1}
    script = {p.question: [response_text(p) if p in right else "=" + str(p.answer + 1)] for p in problems}
    result = evaluate_accuracy(ScriptedModel(tok, script), tok, problems, batch_size=5)
    assert result.accuracy == pytest.approx(len(right) / 12)
    for level in (1, 2, 4):
        of_level = [p for p in problems if p.level == level]
        assert result.per_level[level] == pytest.approx(sum(p in right for p in of_level) / len(of_level))
    assert result.responses == [script[p.question][0] for p in problems]
    assert tok.padding_side == "right", "padding side restored"


def _brute_pass_at_k(flags, k):
    subsets = list(itertools.combinations(range(len(flags)), k))
    return sum(any(flags[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    tok = build_char_tokenizer()
    problems = [Problem(4, (100 + i, 200 + i)) for i in range(4)]
    correct_counts = [0, 1, 3, 5]
    script, flags = {}, []
    for p, c in zip(problems, correct_counts):
        f = [j < c for j in range(5)]
        flags.append(f)
        script[p.question] = [f"={p.answer}" if ok else "=0" for ok in f]
    # the greedy call gets one sequence per prompt: give it the first scripted reply
    greedy_script = {q: r[:1] for q, r in script.items()}

    class TwoPhase(ScriptedModel):
        def generate(self, input_ids, attention_mask, generation_config):
            self.script = script if generation_config.do_sample else greedy_script
            assert not generation_config.do_sample or generation_config.top_k == 0
            return super().generate(input_ids, attention_mask, generation_config)

    result = evaluate_accuracy(TwoPhase(tok, script), tok, problems, num_samples=5)
    assert result.sample_accuracy == pytest.approx(sum(correct_counts) / 20)
    for k in range(1, 6):
        assert result.pass_at_k[k] == pytest.approx(sum(_brute_pass_at_k(f, k) for f in flags) / 4)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(4, 1, 5)


def test_batched_left_padding_equals_one_by_one(tiny_zoo):
    _, paths = tiny_zoo
    problems = sample_problems([1, 2, 3, 4], 8, seed=4)  # prompt lengths differ -> real left padding
    for path in paths.values():
        model, tok = load_agent(path)
        batched = generate_responses(model, tok, problems, max_new_tokens=12)
        single = [generate_responses(model, tok, [p], max_new_tokens=12)[0] for p in problems]
        assert batched == single


def test_empty_problem_list_rejected():
    with pytest.raises(ValueError, match="at least one problem"):
        evaluate_accuracy(None, build_char_tokenizer(), [])
