"""Evaluation: batched left-padded greedy equals one-by-one greedy and the responses recorded from the generate loop
the zoo had before it used the rollout engine; accuracy / per-level / pass@k bookkeeping against a scripted model
and brute-force pass@k."""
import itertools
import json
from pathlib import Path

import pytest
import torch

from openrlhf_hacpo.data.arithmetic import Problem, response_text, sample_problems
from openrlhf_hacpo.zoo import evaluate_accuracy, generate_responses, load_agent
from openrlhf_hacpo.zoo.evaluate import pass_at_k
from openrlhf_hacpo.zoo.tokenizers import build_char_tokenizer


class ScriptedModel(torch.nn.Module):
    """Answers each prompt from a script: ``script[question] = list of responses``; the k-th row of a question
    in one ``generate`` call gets its k-th response. Checks that prompts arrive left-padded."""

    def __init__(self, tokenizer, script):
        super().__init__()
        self.tok, self.script = tokenizer, script
        self.embed = torch.nn.Embedding(len(tokenizer), 1)

    def get_input_embeddings(self):
        return self.embed

    def generate(self, input_ids, attention_mask, generation_config, logits_processor=None):
        assert (attention_mask[:, -1] == 1).all(), "prompts must be left-padded"
        rows, seen = [], {}
        for ids in input_ids:
            question = self.tok.decode(ids, skip_special_tokens=True).split("\n")[0]
            k = seen[question] = seen.get(question, -1) + 1
            rows.append(self.tok.encode(self.script[question][k], add_special_tokens=False) + [self.tok.eos_token_id])
        width = max(map(len, rows))
        new = torch.full((len(rows), width), self.tok.pad_token_id)
        for i, r in enumerate(rows):
            new[i, : len(r)] = torch.tensor(r)
        return torch.cat([input_ids, new], dim=1)


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
        def generate(self, input_ids, attention_mask, generation_config, logits_processor=None):
            self.script = script if generation_config.do_sample else greedy_script
            assert not generation_config.do_sample or (generation_config.top_k == 0 and generation_config.top_p == 1)
            return super().generate(input_ids, attention_mask, generation_config)

    result = evaluate_accuracy(TwoPhase(tok, script), tok, problems, num_samples=5, batch_size=20)
    assert result.sample_accuracy == pytest.approx(sum(correct_counts) / 20)
    for k in range(1, 6):
        assert result.pass_at_k[k] == pytest.approx(sum(_brute_pass_at_k(f, k) for f in flags) / 4)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(4, 1, 5)


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_batched_left_padding_equals_one_by_one(tiny_zoo):
    _, paths = tiny_zoo
    problems = sample_problems([1, 2, 3, 4], 8, seed=4)  # prompt lengths differ -> real left padding
    for path in paths.values():
        model, tok = load_agent(path)
        batched = generate_responses(model, tok, problems, max_new_tokens=12)
        single = [generate_responses(model, tok, [p], max_new_tokens=12)[0] for p in problems]
        assert batched == single


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_responses_match_the_recorded_generate_loop(tiny_zoo):
    """Greedy and seeded sampled texts of both tiny agents equal what the zoo's own batched ``generate`` loop
    produced (recorded in ``recorded_responses.json`` before that loop was replaced by the rollout engine), with
    more problems than one batch holds."""
    _, paths = tiny_zoo
    recorded = json.loads((Path(__file__).parent / "recorded_responses.json").read_text(encoding="utf-8"))
    problems = [Problem(level, tuple(operands)) for level, operands in recorded["problems"]]
    assert problems == sample_problems([1, 2, 3, 4], 10, seed=11)
    for name, responses in recorded["responses"].items():
        model, tok = load_agent(paths[name])
        got = generate_responses(model, tok, problems, max_new_tokens=recorded["max_new_tokens"], batch_size=4)
        assert [r[0] for r in got] == responses, name
        sampled = generate_responses(model, tok, problems, do_sample=True, max_new_tokens=recorded["max_new_tokens"],
                                     num_return_sequences=recorded["samples_per_problem"], batch_size=4,
                                     seed=recorded["sample_seed"])
        assert sampled == recorded["sampled"][name], name


def test_empty_problem_list_rejected():
    with pytest.raises(ValueError, match="at least one problem"):
        evaluate_accuracy(None, build_char_tokenizer(), [])
