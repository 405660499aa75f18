"""Engine outputs regrouped for the policy ranks, and per-token values padded to a pack's response columns."""
from __future__ import annotations

import torch

from openrlhf_hacpo.actors.sharding import outputs_for_shard, split_shards
from openrlhf_hacpo.engines.base import GenerationOutput
from openrlhf_hacpo.utils.padding import micro_batch_groups, pack_rows, packed_positions, pad_values


def out(prompt_index: int, sample_index: int) -> GenerationOutput:
    return GenerationOutput(prompt_index=prompt_index, sample_index=sample_index, response_token_ids=[7],
                            response_text="7", finished=True, finish_reason="stop")


def test_engine_outputs_reach_the_rank_that_owns_their_prompt():
    """5 prompts, 2 engines (prompts 0-2 and 3-4, numbered from 0 by each engine), 2 policy ranks (prompts 0-2 and
    3-4 again, but cut differently below: ranks of 2 and 3). Each rank gets its prompts' outputs renumbered to
    positions in its own shard, in engine order."""
    engine_shards = split_shards(list(range(5)), 2)
    assert engine_shards == [[0, 1, 2], [3, 4]]
    engine_outputs = [[out(0, 0), out(1, 0), out(2, 0), out(0, 1)], [out(0, 0), out(1, 0), out(1, 1)]]
    first = outputs_for_shard([0, 1], engine_shards, engine_outputs)
    second = outputs_for_shard([2, 3, 4], engine_shards, engine_outputs)
    assert [(o.prompt_index, o.sample_index) for o in first] == [(0, 0), (1, 0), (0, 1)]
    assert [(o.prompt_index, o.sample_index) for o in second] == [(0, 0), (1, 0), (2, 0), (2, 1)]


def test_pad_values_right_pads_with_zero_and_fills_missing_rows():
    rows = [torch.tensor([-0.5, -1.5]), None, [-2.0, -3.0, -4.0]]
    assert pad_values(rows, 3).tolist() == [[-0.5, -1.5, 0.0], [0.0, 0.0, 0.0], [-2.0, -3.0, -4.0]]


def test_pack_rows_puts_every_response_at_the_same_column():
    packed = pack_rows([[1, 2, 3], [4]], [[5], [6, 7]], pad_id=9)
    assert packed["input_ids"].tolist() == [[1, 2, 3, 5, 9], [9, 9, 4, 6, 7]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 3], [0, 0, 0, 1, 2]]
    assert packed["response_ids"].tolist() == [[5, 9], [6, 7]]
    assert packed["response_mask"].tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_packed_positions_count_what_pack_rows_computes():
    prompts, responses = [3, 5, 2, 4], [4, 1, 6, 2]
    groups = [[0, 1], [2], [3]]
    # by hand: 2 x (5 + 4) = 18 positions with 7 + 6 real, 1 x 8 with 8, 1 x 6 with 6
    assert packed_positions(prompts, responses, groups) == (18 + 8 + 6, 13 + 8 + 6)
    positions = real = 0
    for g in groups:  # the same counts from the packed tensors themselves
        packed = pack_rows([[7] * prompts[i] for i in g], [[9] * responses[i] for i in g], pad_id=0)
        positions += packed.attention_mask.numel()
        real += int(packed.attention_mask.sum())
    assert packed_positions(prompts, responses, groups) == (positions, real)


def test_micro_batch_groups_in_order_or_by_length():
    assert micro_batch_groups([1] * 5, [3, 1, 3, 1, 2], 2, group_by_length=False) == [[0, 1], [2, 3], [4]]
    by_length = micro_batch_groups([1] * 5, [3, 1, 3, 1, 2], 2, group_by_length=True)
    assert by_length == [[1, 3], [0, 4], [2]]
