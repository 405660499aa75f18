"""Training–inference mismatch figures (openrlhf_hacpo/algorithms/mismatch.py) against hand-computed float64 values."""
import math

import pytest
import torch

from openrlhf_hacpo.algorithms.mismatch import MISMATCH_KEYS, row_summaries, row_summaries_ragged, summarize

# two responses: 3 tokens and 1 token
TRAIN = [[-1.0, -2.0, -0.5], [-3.0]]
ENGINE = [[-1.1, -1.8, -0.5], [-2.6]]
# d = train - engine
D = [[0.1, -0.2, 0.0], [-0.4]]


def _expected() -> dict[str, float]:
    flat = [x for row in D for x in row]
    n = len(flat)
    seq = [sum(row) / len(row) for row in D]  # (-0.1/3, -0.4)
    seq_mean = sum(seq) / len(seq)
    return {
        "mean_abs": (0.1 + 0.2 + 0.0 + 0.4) / 4,
        "max_abs": 0.4,
        "k3_kl": sum(math.exp(x) - x - 1 for x in flat) / n,
        "seq_log_ratio_mean": seq_mean,
        "seq_log_ratio_std": math.sqrt(sum((s - seq_mean) ** 2 for s in seq) / len(seq)),
        # mean NLL_train = (1 + 2 + .5 + 3)/4 = 1.625, mean NLL_engine = (1.1 + 1.8 + .5 + 2.6)/4 = 1.5
        "ppl_ratio": math.exp(1.625 - 1.5),
    }


def test_ragged_rows_give_the_hand_computed_figures():
    got = summarize(row_summaries_ragged(TRAIN, ENGINE))
    want = _expected()
    assert set(got) == set(MISMATCH_KEYS)
    for key in MISMATCH_KEYS:
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    # the sequence figure is a token mean, not a sum: a sum would give mean (-0.1 - 0.4) / 2 = -0.25
    assert got["seq_log_ratio_mean"] == pytest.approx((-0.1 / 3 - 0.4) / 2, rel=1e-12)
    assert got["ppl_ratio"] == pytest.approx(math.exp(0.125), rel=1e-12)


def test_padded_rows_equal_ragged_rows_and_merge_across_parts():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 7.0, 9.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    engine = torch.tensor([[-1.1, -1.8, -0.5], [-2.6, -9.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # padding must not count; the empty row is left out
    padded = row_summaries(train, engine, mask)
    assert padded.shape == (2, 5)
    assert torch.allclose(padded, row_summaries_ragged(TRAIN, ENGINE), rtol=0, atol=1e-15)
    # summaries of separate parts (ranks) concatenate
    parts = torch.cat([row_summaries_ragged(TRAIN[:1], ENGINE[:1]), row_summaries_ragged(TRAIN[1:], ENGINE[1:])])
    assert summarize(parts) == pytest.approx(summarize(padded), rel=1e-12)


def test_k3_is_the_kl_of_the_engine_to_the_trainer():
    # a two-token vocabulary: the engine samples from q, the trainer has p; E_q[k3] = KL(q || p)
    q, p = torch.tensor([0.7, 0.3], dtype=torch.float64), torch.tensor([0.6, 0.4], dtype=torch.float64)
    d = p.log() - q.log()
    expected_kl = float((q * (q.log() - p.log())).sum())
    assert float((q * (d.exp() - d - 1)).sum()) == pytest.approx(expected_kl, rel=1e-12)
    # the module weights tokens by how often they were sampled: 7 of token 0, 3 of token 1
    got = summarize(row_summaries_ragged([[float(p[0].log())] * 7 + [float(p[1].log())] * 3],
                                         [[float(q[0].log())] * 7 + [float(q[1].log())] * 3]))
    assert got["k3_kl"] == pytest.approx(expected_kl, rel=1e-12)


def test_identical_log_probs_give_no_gap_and_empty_input_no_figures():
    got = summarize(row_summaries_ragged(TRAIN, TRAIN))
    assert got == {"mean_abs": 0.0, "max_abs": 0.0, "k3_kl": 0.0, "seq_log_ratio_mean": 0.0,
                   "seq_log_ratio_std": 0.0, "ppl_ratio": 1.0}
    assert summarize(row_summaries_ragged([], [])) == {}
    with pytest.raises(ValueError, match="row 0"):
        row_summaries_ragged([[0.0, 0.0]], [[0.0]])
