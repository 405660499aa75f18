"""benchmarks/compare_tiny_lora.py: the full-parameter side taken from a committed report (its seeds, its agents), the
LoRA parameter counts of the shipped agents, and the report's rows."""
from __future__ import annotations

import pytest
from benchmark_script import load_benchmark


def _module():
    return load_benchmark("compare_tiny_lora")


def _arm(finals, before, seconds=None):
    return {name: {"final_by_seed": {str(s): v for s, v in values.items()}, "acc_before": before[name],
                   "seconds": seconds or {"step": 2.0, "update": 0.5}}
            for name, values in finals.items()}


FULL_REPORT = {
    "meta": {"steps": 80, "agent_fingerprints": {"a": {"fingerprint": "aaa"}, "b": {"fingerprint": "bbb"}}},
    "arms": {"hacpo": {"settings": {"algorithm": "hacpo"},
                       "agents": _arm({"a": {0: 0.2, 1: 0.3, 2: 0.4, 3: 0.9}, "b": {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.1}},
                                      {"a": 0.1, "b": 0.3})}},
}


def test_full_parameter_side_is_the_committed_hacpo_arm_on_the_same_seeds():
    bench = _module()
    full = bench.full_parameter_arm(FULL_REPORT, [0, 1, 2], 80, {"a": "aaa", "b": "bbb"})
    assert full["seeds"] == [0, 1, 2]
    assert full["agents"]["a"]["final_by_seed"] == {"0": 0.2, "1": 0.3, "2": 0.4}
    assert full["agents"]["a"]["final_mean"] == pytest.approx(0.3)
    assert full["agents"]["a"]["final_std"] == pytest.approx(0.1)  # sample std of 0.2, 0.3, 0.4
    with pytest.raises(ValueError, match="other agents"):
        bench.full_parameter_arm(FULL_REPORT, [0], 80, {"a": "aaa", "b": "ccc"})
    with pytest.raises(ValueError, match="ran 80 steps, the LoRA runs 20"):
        bench.full_parameter_arm(FULL_REPORT, [0], 20, {"a": "aaa", "b": "bbb"})
    with pytest.raises(ValueError, match=r"no seed \[7\] for a"):
        bench.full_parameter_arm(FULL_REPORT, [0, 7], 80, {"a": "aaa", "b": "bbb"})


def test_lora_parameters_of_the_shipped_agents():
    bench = _module()
    from openrlhf_hacpo.zoo.shipped import agent_folders

    folders = agent_folders(["llamaS"])
    ((total, adapters),) = bench.trainable_parameters(folders, 8).values()
    # llamaS: hidden 64, 2 layers, 4 heads of 16, MLP 192, K/V heads from its config; rank 8 x (in + out) per module
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(folders["llamaS"])
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = 8 * (2 * 64 + 2 * (64 + kv) + 2 * 64 + 3 * (64 + 192))
    assert adapters == 2 * per_layer and 0 < adapters < total


def test_report_rows():
    bench = _module()
    full = bench.full_parameter_arm(FULL_REPORT, [0, 1, 2], 80, {"a": "aaa", "b": "bbb"})
    lora_agents = _arm({"a": {0: 0.25, 1: 0.2, 2: 0.45}, "b": {0: 0.2, 1: 0.4, 2: 0.5}}, {"a": 0.1, "b": 0.3})
    for entry in lora_agents.values():
        entry["final_mean"] = sum(entry["final_by_seed"].values()) / 3
        entry["final_std"] = 0.0
    lora = {"seeds": [0, 1, 2], "agents": lora_agents}
    meta = {"agents": ["a", "b"], "commands": ["python benchmarks/compare_tiny_lora.py"], "date": "2026-12-02",
            "cpu_count": 2, "lanes": 2, "steps": 80, "fingerprints": {"a": "aaa", "b": "bbb"}}
    text = bench.render(full, lora, {"a": (1000, 100), "b": (2000, 150)}, meta)
    assert "| before training | | – | 0.100 | 0.300 |" in text
    assert "| HACPO, full-parameter | 3 | a 1,000, b 2,000 | 0.300 ± 0.100 | 0.600 ± 0.100 |" in text
    assert "| 1 | 0.300 / 0.200 | 0.600 / 0.400 |" in text
    # a: +0.05, -0.1, +0.05 -> mean -0.000; b: -0.3, -0.2, -0.2
    assert "(2/3 seeds > 0) | -0.233 ± 0.058 (0/3 seeds > 0) |" in text
    # above before training: a all three seeds; b 0.2 < 0.3, so two of three
    assert "(3/3 seeds above) | +0.067 (2/3 seeds above) |" in text
