"""``train_hacpo``'s command line: flags and agent specs into a :class:`TrainConfig`, the errors it prints (no models,
no workers). The config's own rules are tested in ``tests/test_config.py``, the flag generator in ``test_flags.py``."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.algorithms import HACPOConfig
from openrlhf_hacpo.cli.train_hacpo import build_config, build_parser, load_agents_file, main, parse_agent_spec
from openrlhf_hacpo.config import TrainConfig

BASE = ["--prompt_data", "data.jsonl", "--agent", "name=a,pretrain=/m/a", "--agent", "name=b,pretrain=/m/b",
        "--rollout_batch_size", "4", "--n_samples_per_prompt", "2", "--train_batch_size", "8",
        "--micro_train_batch_size", "2"]


def test_help_lists_every_flag_in_groups(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for group in ("agents:", "prompts:", "rollout:", "rewards:", "algorithm:", "training:",
                  "checkpoints and logging:", "evaluation:"):
        assert group in text
    flags = [
        "--prompt_data", "--input_key", "--label_key", "--apply_chat_template", "--n_samples_per_prompt",
        "--rollout_batch_size", "--train_batch_size", "--micro_train_batch_size", "--max_epochs",
        "--num_episodes", "--max_steps", "--prompt_max_len", "--generate_max_len", "--temperature", "--top_p",
        "--actor_learning_rate", "--lr_warmup_steps", "--max_norm", "--adam_betas", "--l2", "--zero_stage",
        "--bf16", "--gradient_checkpointing", "--vllm_num_engines", "--vllm_tensor_parallel_size",
        "--rollout_backend", "--save_path", "--ckpt_path", "--save_steps", "--eval_steps", "--eval_data",
        "--eval_n_samples", "--logging_steps", "--use_tensorboard", "--use_wandb", "--seed", "--resume",
        "--reward_fn", "--init_kl_coef", "--algorithm", "--alpha", "--cross_clip_delta", "--cross_clip_step",
        "--no_stepwise", "--no_cross_clip", "--no_capability_advantage", "--no_capability_coef",
        "--capability_window", "--capability_metric", "--capability_ratio_min", "--capability_ratio_max",
        "--eps_clip_low", "--eps_clip_high", "--eos_policy", "--loss_agg", "--ratio_level", "--minibatch_order",
        "--agent", "--agents_config",
    ]
    missing = [f for f in flags if f not in text]
    assert not missing


def test_agents_inherit_run_wide_settings():
    cfg = build_config(BASE + ["--agent", "name=c,pretrain=/m/c,learning_rate=3e-6,zero_stage=3,bf16=true",
                               "--actor_learning_rate", "1e-6", "--zero_stage", "1"])
    a, b, c = cfg.resolved_agents
    assert (a.learning_rate, a.zero_stage, a.bf16, a.dp_size) == (1e-6, 1, False, 1)
    assert (c.learning_rate, c.zero_stage, c.bf16) == (3e-6, 3, True)
    assert cfg.agents[0].learning_rate is None  # the declared config is left as given
    assert cfg.rows_per_learner == 3 * 4 * 2 and cfg.updates_per_step == 3


def test_hacpo_flags_reach_the_algorithm_config():
    cfg = build_config(BASE + ["--alpha", "3", "--cross_clip_delta", "0.1", "--cross_clip_step", "0.01",
                               "--cross_clip_high", "1.2", "--cross_clip_mode", "pessimistic", "--no_stepwise", "--capability_window", "7", "--capability_metric", "mean_reward",
                               "--eps_clip_low", "1e-3", "--init_kl_coef", "0", "--no_capability_advantage"])
    algo = cfg.algo
    assert algo.algorithm == "hacpo"
    loss = algo.loss.params
    assert (loss.alpha, loss.delta, loss.delta_step, loss.stepwise) == (3.0, 0.1, 0.01, False)
    assert algo.loss.params.cross_clip_high == 1.2 and algo.loss.params.cross_clip_mode == "pessimistic"
    assert (algo.capability.window, algo.capability.metric) == (7, "mean_reward")
    assert algo.loss.params.eps_low == 1e-3 and algo.loss.params.eps_high == HACPOConfig().loss.params.eps_high
    assert algo.loss.params.kl_coef == 0.0 and algo.advantage.capability_weighting is False


def test_presets_for_baselines_and_ablations():
    gspo = build_config(BASE + ["--algorithm", "gspo", "--train_batch_size", "4"])
    assert gspo.algo.advantage.scope == "own" and not gspo.trains_on_foreign
    assert gspo.rows_per_learner == 4 * 2
    grpo = build_config(BASE + ["--algorithm", "grpo", "--train_batch_size", "4"])
    assert (grpo.algo.loss.params.eps_low, grpo.algo.loss.params.eps_high) == (0.2, 0.28)
    ablation = build_config(BASE + ["--algorithm", "hacpo-no-clip"])
    assert ablation.algo.algorithm == "hacpo" and ablation.algo.loss.params.cross_clip is False


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "gspo", "--train_batch_size", "4", "--alpha", "2"], "--alpha"),
    (["--algorithm", "grpo", "--train_batch_size", "4", "--no_capability_advantage"], "own rollouts"),
    (["--algorithm", "naive", "--cross_clip_delta", "0.1"], "incompatible"),
    (["--algorithm", "gspo", "--train_batch_size", "4", "--cross_clip_high", "1.2"], "--cross_clip_high"),
    (["--cross_clip_high", "0.9"], "cross_clip_high"),
    (["--train_batch_size", "6"], "train_batch_size=6 must divide"),
    (["--micro_train_batch_size", "3"], "micro_train_batch_size"),
    (["--ratio_level", "token"], "ratio_level='token'"),
    (["--no_ray", "--rollout_backend", "vllm"], "needs Ray"),
    (["--temperature", "0"], "temperature"),
    (["--top_p", "1.5"], "--top_p (TrainConfig.rollout.top_p) must be <= 1, got 1.5"),
    (["--eval_steps", "2"], "eval_data"),
    (["--save_steps", "0"], "save_steps"),
])
def test_incompatible_flags_are_rejected(extra, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(BASE + extra)


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "gspo", "--alpha", "1.0"], "--algorithm gspo is incompatible with --alpha: it trains each agent on "
                                                "its own rollouts only"),
    (["--algorithm", "naive", "--cross_clip_delta", "0.2", "--no_stepwise"],
     "--algorithm naive is incompatible with --cross_clip_delta, --no_stepwise: naive applies the self clip to every "
     "row"),
])
def test_algorithm_only_flags_are_refused_when_typed_even_at_their_default(extra, message):
    """The command line refuses an algorithm-only flag the user typed, whatever its value; a config built any other
    way is refused when such a field differs from its default (``tests/test_config.py``)."""
    with pytest.raises(ValueError) as info:
        build_config(BASE + ["--train_batch_size", "4"] * ("gspo" in extra) + extra)
    assert str(info.value) == message


def test_agent_spec_errors_name_the_setting():
    with pytest.raises(ValueError, match="unknown agent setting 'lr'"):
        parse_agent_spec("name=a,pretrain=/m,lr=1")
    with pytest.raises(ValueError, match="bad value for 'zero_stage'"):
        parse_agent_spec("name=a,pretrain=/m,zero_stage=two")
    with pytest.raises(ValueError, match="missing the required setting 'pretrain'"):
        parse_agent_spec("name=a")
    with pytest.raises(ValueError, match=r"\(agent 'a'\): AgentConfig\.zero_stage must be one of \[0, 1, 2, 3\], got 4"):
        parse_agent_spec("name=a,pretrain=/m,zero_stage=4")
    with pytest.raises(ValueError, match="names must be unique"):
        build_config(["--prompt_data", "d.jsonl", "--agent", "name=a,pretrain=/m", "--agent", "name=a,pretrain=/n"])
    with pytest.raises(ValueError, match="no agents"):
        build_config(["--prompt_data", "d.jsonl"])


def test_main_reports_config_errors_with_status_2(capsys):
    assert main(BASE + ["--train_batch_size", "6"]) == 2
    assert "train_batch_size=6" in capsys.readouterr().err


def test_agents_yaml(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  - {name: q, pretrain: /m/q, learning_rate: 2.0e-6}\n  - name: l\n    pretrain: /m/l\n"
                    "    vllm_num_engines: 2\n")
    agents = load_agents_file(str(path))
    assert [a.name for a in agents] == ["q", "l"]
    assert agents[0].learning_rate == 2e-6 and agents[1].vllm_num_engines == 2
    cfg = build_config(["--prompt_data", "d.jsonl", "--agents_config", str(path), "--agent", "name=z,pretrain=/z",
                        "--rollout_batch_size", "2", "--n_samples_per_prompt", "2", "--train_batch_size", "12",
                        "--micro_train_batch_size", "2"])
    assert cfg.agent_names == ["q", "l", "z"]
    path.write_text("agents:\n  - {name: q, pretrain: /m/q, learning_rat: 1}\n")
    with pytest.raises(ValueError, match=r"agents config .*entry 0.*learning_rat"):
        load_agents_file(str(path))
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_agents_file(str(tmp_path / "missing.yaml"))


def test_train_config_round_trip():
    cfg = build_config(BASE + ["--algorithm", "hacpo-no-omega", "--alpha", "2"])
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="no field"):
        TrainConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_token_level_ratios_is_one_fact():
    def algo(*argv):
        return build_config(BASE + ["--train_batch_size", "4", *argv]).algo

    assert algo("--algorithm", "grpo").token_level_ratios
    assert algo("--algorithm", "grpo", "--ratio_level", "sequence").token_level_ratios  # grpo's loss is per token
    assert algo("--algorithm", "gspo", "--ratio_level", "token").token_level_ratios
    assert not algo("--algorithm", "gspo").token_level_ratios
    assert not build_config(BASE).algo.token_level_ratios
    with pytest.raises(ValueError, match="ratio_level='token' is incompatible with algorithm='naive'"):
        HACPOConfig.from_dict({"algorithm": "naive", "loss": {"ratio_level": "token"}})


def test_uses_kl_follows_kl_coef():
    assert build_config(BASE).algo.loss.uses_kl  # 0.001 by default
    assert not build_config(BASE + ["--init_kl_coef", "0"]).algo.loss.uses_kl
