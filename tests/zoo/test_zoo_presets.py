"""Presets: one per heterogeneity type plus N=3, with the recommended RL hyperparameters; the zoo CLI."""
import json

import pytest

from openrlhf_hacpo.zoo import AGENTS, DEFAULT_PRESET, PRESETS, AgentSpec, RLHyperparams, get_preset, resolve_agents
from openrlhf_hacpo.zoo import __main__ as zoo_cli
from openrlhf_hacpo.zoo.presets import Preset


def test_model_preset_is_default_and_heterogeneous_in_model():
    p = get_preset(DEFAULT_PRESET)
    assert p.name == "model" and p.agent_names == ("llamaS", "qwenM")
    llama, qwen = p.agents
    assert llama.model.family != qwen.model.family and llama.tokenizer != qwen.tokenizer


def test_size_preset_same_family_different_shape():
    small, medium = get_preset("size").agents
    assert small.model.family == medium.model.family and small.tokenizer == medium.tokenizer
    assert (small.model.hidden_size, small.model.num_layers) < (medium.model.hidden_size, medium.model.num_layers)


def test_state_preset_same_model_two_stages():
    late, early = get_preset("state").agents
    assert late.model == early.model and late.tokenizer == early.tokenizer
    assert late.warm_start.seed == early.warm_start.seed
    assert early.warm_start.target_band[1] <= late.warm_start.target_band[0], "the early agent stops sooner"


def test_three_agent_preset():
    assert len(get_preset("three").agents) == 3
    assert {p.heterogeneity for p in PRESETS.values()} == {"model", "size", "state", "mixed"}


def test_recommended_rl_hyperparameters():
    rl = get_preset("model").rl
    assert (rl.prompt_levels, rl.prompts_per_step, rl.group_size, rl.lr, rl.warmup_steps) == ((4,), 16, 8, 3e-4, 10)
    assert (rl.grad_clip, rl.temperature, rl.max_new_tokens, rl.num_steps) == (1.0, 1.0, 40, 80)
    assert (rl.eval_every, rl.eval_split, rl.eval_size) == (10, "test", 400)
    with pytest.raises(ValueError, match="group_size"):
        RLHyperparams(group_size=0)
    with pytest.raises(ValueError, match="eval_split"):
        RLHyperparams(eval_split="train")


def test_resolve_agents():
    assert resolve_agents("size") == get_preset("size").agents
    assert resolve_agents(get_preset("state")) == get_preset("state").agents
    assert [a.name for a in resolve_agents(["qwenS", AGENTS["llamaS"]])] == ["qwenS", "llamaS"]
    assert resolve_agents("qwenM") == (AGENTS["qwenM"],)
    with pytest.raises(ValueError, match="unknown zoo agent or preset 'gpt5'"):
        resolve_agents(["gpt5"])
    with pytest.raises(ValueError, match="unknown zoo preset"):
        get_preset("nope")


def test_spec_validation():
    with pytest.raises(ValueError, match="AgentSpec.name"):
        AGENTS["qwenM"].replace(name="a/b")
    with pytest.raises(ValueError, match="AgentSpec.tokenizer"):
        AgentSpec("x", "wordpiece", AGENTS["qwenM"].model, AGENTS["qwenM"].warm_start)
    with pytest.raises(ValueError, match="distinct"):
        Preset("dup", "model", "", (AGENTS["qwenM"], AGENTS["qwenM"]))
    assert AGENTS["qwenM"].replace(warm_start={"steps": 5, "target_band": None}).warm_start.steps == 5


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_cli_build_and_list(tmp_path, monkeypatch, capsys, make_tiny_spec):
    tiny = (make_tiny_spec("llamaS", steps=2),)
    monkeypatch.setattr(zoo_cli, "resolve_agents", lambda selection: tiny)
    assert zoo_cli.main(["build", "--preset", "model", "--cache-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    row = json.loads(out.strip().splitlines()[-1])
    assert row["agent"] == "llamaS" and row["sft_steps"] == 2 and 0.0 <= row["test_accuracy"] <= 1.0
    assert "[zoo] llamaS: building" in err and "saved to" in err
    assert zoo_cli.main(["list", "--cache-dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "preset model" in listing and "llamaS" in listing
    with pytest.raises(SystemExit):
        zoo_cli.main(["build", "--preset", "nope"])
