"""The Table 1 launcher: every pair x method command line is accepted by the trainer's CLI with the paper's settings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.config import FLAT_NAMES
from openrlhf_hacpo.reproduce.evaluate import LAUNCHER_METHODS, LAUNCHER_PAIRS
from openrlhf_hacpo.reproduce.paper_tables import paper_model_name

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"
PAIRS = {  # pair -> (agent models, alpha, delta, delta_step) as Table 1 / Table 5 give them
    "qwen3_1.7b_4b": (["Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-4B-Base"], 1.0, 0.2, 0.025),
    "qwen3_4b_llama3.2_3b": (["Qwen/Qwen3-4B-Base", "meta-llama/Llama-3.2-3B-Instruct"], 1.0, 0.2, 0.025),
    "qwen3_4b_instruct": (["Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Instruct-2507"], 3.0, 0.2, 0.01),
}
METHODS = {  # method -> (registered algorithm, rollouts per prompt, optimizer updates per step)
    "hacpo": ("hacpo", 8, 4),  # 2 agents x 128 x 8 = 2048 rows / 512
    "gspo": ("gspo", 8, 2),
    "gspo_x2": ("gspo", 16, 4),
    "grpo": ("grpo", 8, 2),
    "naive": ("naive", 8, 4),
}


def _argv_of(tmp_path: Path, *args: str, env: dict | None = None) -> list[str]:
    """Run the launcher with a stand-in ``python3`` that records its arguments."""
    shim = tmp_path / "python3"
    shim.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    shim.chmod(0o755)
    full_env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", **(env or {})}
    subprocess.run(["bash", str(SCRIPTS / "train_table1.sh"), *args], check=True, env=full_env, capture_output=True)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["-m", "openrlhf_hacpo.cli.train_hacpo"]
    return argv[2:]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.integration
def test_every_pair_and_method_parses_with_the_paper_settings(tmp_path, pair, method):
    cfg = build_config(_argv_of(tmp_path, pair, method, env={"HACPO_CACHE_DIR": "/c"}))
    models, alpha, delta, delta_step = PAIRS[pair]
    algorithm, samples, updates = METHODS[method]
    assert [a.pretrain for a in cfg.agents] == models
    assert [a.name for a in cfg.agents] == [paper_model_name(m) for m in models]  # labels of the evaluation
    assert cfg.algo.algorithm == algorithm
    assert cfg.rollout.n_samples_per_prompt == samples and cfg.updates_per_step == updates
    assert cfg.rollout.rollout_backend == "vllm" and cfg.rewards.reward_fn == "boxed_exact"
    # the files `python -m openrlhf_hacpo.cli.prepare` writes by default
    assert cfg.prompts.prompt_data == "/c/reproduce/data/math_train.jsonl"
    assert cfg.eval.eval_data == "/c/reproduce/data/math500.jsonl"
    assert cfg.eval.eval_steps == 3 and cfg.eval.eval_before_training
    # training and in-training validation at the paper's training length (App. A, both official launchers); 8196 is
    # the evaluation length of Tables 1, 2, 3 and 7 (cli.evaluate)
    assert cfg.prompts.generate_max_len == cfg.eval.eval_generate_max_len == 4096 and cfg.prompts.prompt_max_len == 1024
    # the main branch, which produced the paper's numbers: the final EOS trained, foreign text with its EOS string
    assert cfg.rollout.eos_policy == "text"
    assert cfg.outputs.save_path == f"runs/table1/{pair}/{method}"
    if algorithm == "grpo":
        assert (cfg.algo.loss.params.eps_low, cfg.algo.loss.params.eps_high) == (0.2, 0.28)
        assert cfg.algo.loss.params.loss_agg == "seq-mean-token-mean"  # the paper's GRPO formula, a documented choice
        assert cfg.algo.loss.params.dual_clip_c == 3.0  # verl's clip_ratio_c
    else:
        assert (cfg.algo.loss.params.eps_low, cfg.algo.loss.params.eps_high) == (3e-4, 4e-4)
    if algorithm == "hacpo":
        loss = cfg.algo.loss.params
        assert (loss.alpha, loss.delta, loss.delta_step) == (alpha, delta, delta_step)


def test_the_evaluation_knows_every_pair_and_method():
    assert set(LAUNCHER_PAIRS) == set(PAIRS) and set(LAUNCHER_METHODS) == set(METHODS)


@pytest.mark.integration
def test_variables_and_trailing_flags_override(tmp_path):
    argv = _argv_of(tmp_path, "qwen3_1.7b_4b", "hacpo", "--max_steps", "6",
                    env={"MODEL_A": "/m/a", "DATA_DIR": "/d", "SAVE_PATH": "/r", "GENERATE_MAX_LEN": "4096"})
    cfg = build_config(argv)
    assert cfg.agents[0].pretrain == "/m/a" and cfg.prompts.prompt_data == "/d/math_train.jsonl"
    assert cfg.outputs.save_path == "/r" and cfg.prompts.generate_max_len == 4096 and cfg.train.max_steps == 6
    argv = _argv_of(tmp_path, "qwen3_1.7b_4b", "grpo", env={"GENERATE_MAX_LEN": "8196"})
    cfg = build_config([*argv, "--loss_agg", "token-mean"])
    assert cfg.prompts.generate_max_len == cfg.eval.eval_generate_max_len == 8196
    assert cfg.algo.loss.params.loss_agg == "token-mean"


@pytest.mark.parametrize("method", ["gspo", "gspo_x2", "grpo"])
@pytest.mark.integration
def test_one_agent_of_a_pair_trains_alone(tmp_path, method):
    cfg = build_config(_argv_of(tmp_path, "qwen3_4b_llama3.2_3b", method, env={"TRAIN_AGENTS": "b"}))
    assert [(a.name, a.pretrain) for a in cfg.agents] == [("Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-3B-Instruct")]
    assert cfg.updates_per_step == METHODS[method][2]  # one agent's rows, as in the two-agent job


@pytest.mark.parametrize("method,agents", [("hacpo", "b"), ("naive", "a"), ("gspo", "c")])
@pytest.mark.integration
def test_train_agents_is_refused_where_it_makes_no_sense(tmp_path, method, agents):
    result = subprocess.run(["bash", str(SCRIPTS / "train_table1.sh"), "qwen3_1.7b_4b", method],
                            env={**os.environ, "TRAIN_AGENTS": agents}, capture_output=True, text=True)
    assert result.returncode == 2 and "TRAIN_AGENTS" in result.stderr


SMALL_UPDATES = {"hacpo": 2, "gspo": 1, "gspo_x2": 2, "grpo": 1, "naive": 2}  # 1 prompt x G/4 rows, 2 per update


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.integration
def test_the_small_scale_keeps_the_method_flags(tmp_path, method):
    env = {"SCALE": "small", "MODEL_A": "/m/smol", "MODEL_B": "/m/zoo", "DATA_DIR": "/d"}
    small = build_config(_argv_of(tmp_path, "small", method, env=env))
    paper = build_config(_argv_of(tmp_path, "qwen3_1.7b_4b", method))
    assert [(a.name, a.pretrain) for a in small.agents] == [("SmolLM2-135M-Instruct", "/m/smol"), ("qwenS", "/m/zoo")]
    assert small.algo == paper.algo  # algorithm, clips, alpha, delta, delta_step, window, KL, aggregation
    assert small.rollout.n_samples_per_prompt * 4 == paper.rollout.n_samples_per_prompt
    assert small.updates_per_step == SMALL_UPDATES[method]
    assert not small.cluster.use_ray and small.rollout.rollout_backend == "hf"
    assert small.agent_defaults.zero_stage == 0 and not small.agent_defaults.bf16
    assert small.train.max_steps == 2 and small.prompts.generate_max_len == small.eval.eval_generate_max_len == 8
    assert small.prompts.prompt_data == small.eval.eval_data == "/d/champ_small.jsonl"
    assert small.prompts.prompt_max_len == 112
    for name in ("eos_policy", "reward_fn", "eval_before_training", "eval_steps", "seed", "drop_long_prompts"):
        section, field = FLAT_NAMES[name]
        assert getattr(getattr(small, section), field) == getattr(getattr(paper, section), field), name


@pytest.mark.integration
def test_the_small_pair_needs_its_models_and_the_small_scale(tmp_path):
    for env in ({"SCALE": "small"}, {"MODEL_A": "/a", "MODEL_B": "/b"}):
        result = subprocess.run(["bash", str(SCRIPTS / "train_table1.sh"), "small", "hacpo"],
                                env={**os.environ, **env}, capture_output=True, text=True)
        assert result.returncode == 2 and ("MODEL_A" in result.stderr or "SCALE=small" in result.stderr)


@pytest.mark.parametrize("args", [("qwen3_1.7b_4b",), ("nopair", "hacpo"), ("qwen3_1.7b_4b", "ppo")])
@pytest.mark.integration
def test_bad_pair_or_method_is_named(tmp_path, args):
    result = subprocess.run(["bash", str(SCRIPTS / "train_table1.sh"), *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert "PAIR" in result.stderr
    if len(args) == 2:
        assert repr(args[0] if args[0] == "nopair" else args[1]).strip("'") in result.stderr


def test_the_reward_fn_help_lists_every_registered_verifier():
    from openrlhf_hacpo.cli.train_hacpo import build_parser
    from openrlhf_hacpo.rollout.reward_fns import registered_reward_fns

    (action,) = [a for a in build_parser()._actions if "--reward_fn" in a.option_strings]
    assert "boxed_exact" in registered_reward_fns()
    assert [name for name in registered_reward_fns() if name not in action.help] == []
