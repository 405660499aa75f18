"""Learner-view statistics of the policy worker, without Ray or a model: hand-built rows, hand-computed values."""
from __future__ import annotations

import pytest
import torch

from openrlhf_hacpo.actors.learner_metrics import record_view_stats
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow
from openrlhf_hacpo.utils.weighted import WeightedMeans, merge_weighted


def row(source: int, learner_tokens: int, source_tokens: int, own: bool) -> LearnerRow:
    return LearnerRow(prompt_id="p", prompt_ids=[1, 2], response_ids=list(range(learner_tokens)), is_own=own,
                      source=source, reward=1.0, old_logp_mean=-1.0, old_logp=None,
                      source_num_tokens=source_tokens)


def test_per_source_token_counts_and_retokenization_ratio_merge_over_ranks():
    """Learner 0; agent 1's responses were 37 and 3 tokens long in its own tokenizer and are 129 and 11 tokens in
    the learner's; agent 2's one response 10 -> 5. Two ranks hold different rows; the merged figures are the
    totals' ratios: agent 1 (129 + 11) / (37 + 3) = 3.5, agent 2 0.5; mean learner tokens 70 and 5."""
    names = ["learner", "char_agent", "bpe_agent"]
    rank0 = LearnerBatch(learner=0, rows=[row(0, 4, 4, True), row(1, 129, 37, False)])
    rank1 = LearnerBatch(learner=0, rows=[row(0, 6, 6, True), row(1, 11, 3, False), row(2, 5, 10, False)])
    states = []
    for batch in (rank0, rank1):
        stats = WeightedMeans()
        record_view_stats(batch, torch.zeros(len(batch)), stats, names)
        states.append(stats.state())
    merged = merge_weighted(states)
    assert merged["view/retokenization_ratio/char_agent"] == pytest.approx(3.5)
    assert merged["view/retokenization_ratio/bpe_agent"] == pytest.approx(0.5)
    assert merged["view/foreign_tokens/char_agent"] == pytest.approx(70.0)
    assert merged["view/foreign_tokens/bpe_agent"] == pytest.approx(5.0)
    assert "view/retokenization_ratio/learner" not in merged
