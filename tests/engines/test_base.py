"""SamplingConfig validation, seed derivation and the small helpers shared by both backends."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.engines import GenerationOutput, SamplingConfig, cut_at_eos, validate_prompts
from openrlhf_hacpo.utils.seeding import derive_seed


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 0),
        ("n", 1.5),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("max_new_tokens", 0),
        ("seed", -1),
        ("seed", 1.0),
    ],
)
def test_sampling_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        SamplingConfig(**{field: value})


def test_greedy_and_top_k_normalisation():
    assert SamplingConfig(temperature=0.0).is_greedy
    assert SamplingConfig(greedy=True, temperature=0.7).is_greedy
    assert not SamplingConfig(temperature=0.7).is_greedy
    assert SamplingConfig(top_k=-1).effective_top_k == 0
    assert SamplingConfig(top_k=0).effective_top_k == 0
    assert SamplingConfig(top_k=5).effective_top_k == 5


def test_derive_seed_is_deterministic_in_range_and_spreads():
    assert derive_seed(1, 2) == derive_seed(1, 2)
    seeds = {derive_seed(42, step) for step in range(1000)}
    assert len(seeds) == 1000
    assert all(0 <= seed < 2**31 - 1 for seed in seeds)
    # Unrelated streams for neighbouring inputs: not seed + step.
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(1, 2) - derive_seed(1, 1) != 1


def test_for_step_sets_a_step_seed_and_keeps_the_rest():
    base = SamplingConfig(n=4, temperature=0.9, max_new_tokens=7)
    stepped = base.for_step(run_seed=3, step=10)
    assert stepped.seed == derive_seed(3, 10)
    assert (stepped.n, stepped.temperature, stepped.max_new_tokens) == (4, 0.9, 7)


def test_cut_at_eos():
    assert cut_at_eos([5, 6, 2, 7, 2], [2]) == ([5, 6, 2], True)
    assert cut_at_eos([5, 6, 7], [2]) == ([5, 6, 7], False)
    assert cut_at_eos([9, 5, 3], [3, 9]) == ([9], True)
    assert cut_at_eos([5, 2], []) == ([5, 2], False)


def test_validate_prompts_accepts_tensors_and_names_bad_prompts():
    import torch

    assert validate_prompts([torch.tensor([1, 2]), [3]]) == [[1, 2], [3]]
    with pytest.raises(ValueError, match="prompt 1 holds token id 7"):
        validate_prompts([[1], [7]], vocab_size=5)
    with pytest.raises(ValueError, match="list of token-id lists"):
        validate_prompts("hello")
    with pytest.raises(ValueError, match="prompt 0 must be a list"):
        validate_prompts(["hello"])


def test_generation_output_to_dict_round_trip():
    out = GenerationOutput(0, 1, [4, 2], "x", True, "stop", [-0.5, -1.0])
    assert GenerationOutput(**out.to_dict()) == out
    assert out.num_tokens == 2
