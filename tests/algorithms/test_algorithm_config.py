"""Configuration dataclasses: code defaults (docs/algorithm.md §5), validation messages, presets and dict round trips."""
import dataclasses
import json
import math
import re

import pytest

from openrlhf_hacpo.algorithms import (
    PRESETS,
    AdvantageConfig,
    CapabilityConfig,
    HACPOConfig,
    PolicyLossConfig,
    get_policy_loss,
)


def test_defaults_are_the_official_code_defaults():
    cap = CapabilityConfig()
    assert (cap.metric, cap.window, cap.floor, cap.ratio_min, cap.ratio_max, cap.warmup_steps) == (
        "positive_rate", 5, 1e-8, 0.1, 10.0, 0)
    adv = AdvantageConfig()
    assert (adv.capability_weighting, adv.scope, adv.std_normalize, adv.eps, adv.uniform_reward_guard,
            adv.baseline_guard) == (True, "joint", True, 1e-6, True, True)
    loss = PolicyLossConfig()
    p = loss.params
    assert (p.eps_low, p.eps_high, p.delta, p.delta_step, p.alpha) == (3e-4, 4e-4, 0.2, 0.025, 1.0)
    assert (p.log_ratio_clip, p.log_ratio_clip_mode, p.kl_coef, p.loss_agg) == (
        10.0, "symmetric", 0.001, "seq-mean-token-mean")
    assert p.stepwise and p.cross_clip and loss.capability_coef


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: PolicyLossConfig.of(alpha=-1), r"PolicyLossConfig\.params\.alpha\)? must be >= 0, got -1"),
        (lambda: PolicyLossConfig.of(eps_low=1.5), r"PolicyLossConfig\.params\.eps_low\)? must be < 1"),
        (lambda: PolicyLossConfig.of(delta=1.2), r"PolicyLossConfig\.params\.delta\)? must be <= 1"),
        (lambda: PolicyLossConfig.of(delta_step=float("nan")),
         r"PolicyLossConfig\.params\.delta_step\)? must be finite"),
        (lambda: PolicyLossConfig.of(log_ratio_clip=0.0),
         r"PolicyLossConfig\.params\.log_ratio_clip\)? must be > 0 or None"),
        (lambda: PolicyLossConfig.of(log_ratio_clip_mode="lower"), r"PolicyLossConfig\.params\.log_ratio_clip_mode"),
        (lambda: PolicyLossConfig.of(loss_agg="seq-sum"), r"PolicyLossConfig\.params\.loss_agg\)? must be one of"),
        (lambda: PolicyLossConfig.of(ratio_level="word"), r"PolicyLossConfig\.params\.ratio_level"),
        (lambda: PolicyLossConfig.of(delta=1.5),
         r"--cross_clip_delta \(PolicyLossConfig\.params\.delta\) must be <= 1"),
        (lambda: PolicyLossConfig.of(dual_clip_c=1.0),
         r"--dual_clip_c \(PolicyLossConfig\.params\.dual_clip_c\) must be > 1"),
        (lambda: PolicyLossConfig.of(stepwise=1), r"PolicyLossConfig\.params\.stepwise\)? must be a bool"),
        (lambda: PolicyLossConfig.of(kl_coef=-0.1), r"PolicyLossConfig\.params\.kl_coef\)? must be >= 0"),
        (lambda: CapabilityConfig(window=0), r"--capability_window \(CapabilityConfig\.window\) must be >= 1, got 0"),
        (lambda: CapabilityConfig(metric="accuracy"), r"--capability_metric \(CapabilityConfig\.metric\) must be one of"),
        (lambda: CapabilityConfig(floor=0.0), r"CapabilityConfig\.floor must be > 0"),
        (lambda: CapabilityConfig(ratio_min=-1.0),
         r"--capability_ratio_min \(CapabilityConfig\.ratio_min\) must be >= 0"),
        (lambda: CapabilityConfig(ratio_max=0.05),
         r"--capability_ratio_max \(CapabilityConfig\.ratio_max\) must be > 0 and >= ratio_min"),
        (lambda: CapabilityConfig(warmup_steps=-1),
         r"--capability_warmup_steps \(CapabilityConfig\.warmup_steps\) must be >= 0"),
        (lambda: AdvantageConfig(scope="all"), r"AdvantageConfig\.scope must be one of \['joint', 'own'\]"),
        (lambda: AdvantageConfig(eps=-1e-6), r"AdvantageConfig\.eps must be >= 0"),
        (lambda: AdvantageConfig(baseline_guard="yes"), r"AdvantageConfig\.baseline_guard must be a bool"),
        (lambda: HACPOConfig(algorithm="ppo"), r"HACPOConfig\.algorithm must be one of"),
        (lambda: HACPOConfig(loss=AdvantageConfig()), r"HACPOConfig\.loss must be a PolicyLossConfig"),
    ],
)
def test_validation_names_the_field(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


# every field of CapabilityConfig and AdvantageConfig with a value its rule refuses, and how the error names it: each
# case fails if that field's rule (option metadata, annotation or cross-field rule) were dropped
_CAP = "CapabilityConfig"
_ADV = "AdvantageConfig"


@pytest.mark.parametrize(
    "cls, name, value, label, rule",
    [
        (CapabilityConfig, "metric", "accuracy", f"--capability_metric ({_CAP}.metric)",
         "one of ['positive_rate', 'mean_reward']"),
        (CapabilityConfig, "metric", "", f"--capability_metric ({_CAP}.metric)", "a non-empty string"),
        (CapabilityConfig, "window", 0, f"--capability_window ({_CAP}.window)", ">= 1"),
        (CapabilityConfig, "window", 2.0, f"--capability_window ({_CAP}.window)", "an int"),
        (CapabilityConfig, "window", True, f"--capability_window ({_CAP}.window)", "an int"),
        (CapabilityConfig, "floor", 0.0, f"{_CAP}.floor", "> 0"),
        (CapabilityConfig, "floor", -1e-8, f"{_CAP}.floor", "> 0"),
        (CapabilityConfig, "floor", math.inf, f"{_CAP}.floor", "a finite number"),
        (CapabilityConfig, "ratio_min", -0.5, f"--capability_ratio_min ({_CAP}.ratio_min)", ">= 0"),
        (CapabilityConfig, "ratio_min", math.nan, f"--capability_ratio_min ({_CAP}.ratio_min)", "a finite number"),
        (CapabilityConfig, "ratio_max", 0.0, f"--capability_ratio_max ({_CAP}.ratio_max)", "> 0"),
        (CapabilityConfig, "ratio_max", 0.05, f"--capability_ratio_max ({_CAP}.ratio_max)",
         "> 0 and >= ratio_min (0.1)"),
        (CapabilityConfig, "ratio_max", math.nan, f"--capability_ratio_max ({_CAP}.ratio_max)", "a number"),
        (CapabilityConfig, "warmup_steps", -1, f"--capability_warmup_steps ({_CAP}.warmup_steps)", ">= 0"),
        (CapabilityConfig, "warmup_steps", None, f"--capability_warmup_steps ({_CAP}.warmup_steps)", "an int"),
        (AdvantageConfig, "capability_weighting", 1,
         f"--no_capability_advantage ({_ADV}.capability_weighting)", "a bool"),
        (AdvantageConfig, "scope", "all", f"{_ADV}.scope", "one of ['joint', 'own']"),
        (AdvantageConfig, "std_normalize", "no", f"{_ADV}.std_normalize", "a bool"),
        (AdvantageConfig, "eps", -1e-6, f"{_ADV}.eps", ">= 0"),
        (AdvantageConfig, "eps", math.inf, f"{_ADV}.eps", "a finite number"),
        (AdvantageConfig, "uniform_reward_guard", 0, f"{_ADV}.uniform_reward_guard", "a bool"),
        (AdvantageConfig, "baseline_guard", "yes", f"{_ADV}.baseline_guard", "a bool"),
        (AdvantageConfig, "baseline_guard_threshold", math.nan, f"{_ADV}.baseline_guard_threshold",
         "a finite number"),
        (AdvantageConfig, "baseline_guard_threshold", "1", f"{_ADV}.baseline_guard_threshold", "a finite number"),
        (AdvantageConfig, "require_equal_group_sizes", None, f"{_ADV}.require_equal_group_sizes", "a bool"),
    ],
)
def test_capability_and_advantage_fields_refuse_values_out_of_their_rules(cls, name, value, label, rule):
    message = f"{label} must be {rule}, got {value!r}"
    with pytest.raises(ValueError) as built:
        cls(**{name: value})
    assert str(built.value) == message
    # validate() checks the same rules on an object changed after it was built
    cfg = cls()
    setattr(cfg, name, value)
    with pytest.raises(ValueError) as checked:
        cfg.validate()
    assert str(checked.value) == message
    # and so does the whole algorithm config holding it
    section = {CapabilityConfig: "capability", AdvantageConfig: "advantage"}[cls]
    algo = HACPOConfig()
    setattr(getattr(algo, section), name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        algo.validate()


def test_capability_ratio_bounds_at_their_edges_are_accepted():
    assert CapabilityConfig(ratio_min=0.0, ratio_max=math.inf).ratio_max == math.inf
    assert CapabilityConfig(ratio_min=2.0, ratio_max=2.0).ratio_max == 2.0
    assert CapabilityConfig(window=1, warmup_steps=0, floor=1e-30).window == 1
    assert AdvantageConfig(eps=0.0, baseline_guard_threshold=-3.0).eps == 0.0


def test_validation_runs_on_replace():
    with pytest.raises(ValueError, match=r"LossParams\.alpha"):
        dataclasses.replace(PolicyLossConfig().params, alpha=-2.0)


def test_paper_variant_capability_settings_are_valid():
    cap = CapabilityConfig(metric="mean_reward", ratio_min=0.0, ratio_max=math.inf)
    assert cap.ratio_max == math.inf


def test_presets():
    assert set(PRESETS) == {"hacpo", "gspo", "grpo", "naive", "naive-paper", "naive-gated", "hacpo-no-adv",
                            "hacpo-no-omega", "hacpo-no-clip", "hacpo-no-stepwise"}
    full = HACPOConfig.preset("hacpo")
    assert full == HACPOConfig()
    assert full.trains_on_foreign and full.loss_name == "hacpo"

    gspo = HACPOConfig.preset("gspo")
    assert gspo.algorithm == "gspo" and gspo.advantage.scope == "own" and not gspo.trains_on_foreign
    grpo = HACPOConfig.preset("grpo")
    assert (grpo.loss.params.eps_low, grpo.loss.params.eps_high, grpo.loss.params.ratio_level) == (0.2, 0.28, "token")
    base_loss = HACPOConfig.preset("hacpo").loss
    naive = HACPOConfig.preset("naive")
    assert naive.algorithm == "naive" and not naive.advantage.capability_weighting and naive.trains_on_foreign
    assert HACPOConfig.preset("naive-gated") == naive  # "naive" is the older name of the success-gated reading
    paper = HACPOConfig.preset("naive-paper")  # HACPO with -Adv, -omega, alpha = 0 and no foreign window
    assert paper.algorithm == "hacpo" and paper.trains_on_foreign and not paper.advantage.capability_weighting
    assert (paper.loss.capability_coef, paper.loss.params.alpha, paper.loss.params.cross_clip) == (False, 0.0, False)
    assert paper.loss.replaced({"capability_coef": True, "alpha": 1.0, "cross_clip": True}) == base_loss

    # each ablation switches exactly one mechanism off
    base = HACPOConfig.preset("hacpo")
    changes = {
        "hacpo-no-adv": ("advantage", "capability_weighting"),
        "hacpo-no-omega": ("loss", "capability_coef"),
        "hacpo-no-clip": ("loss", "cross_clip"),
        "hacpo-no-stepwise": ("loss", "stepwise"),
    }
    for name, (section, field) in changes.items():
        cfg = HACPOConfig.preset(name)
        assert cfg.algorithm == "hacpo"
        values = getattr(cfg, section)
        if section == "loss":  # the loss's settings by their flat names (its params object and capability_coef)
            assert values.settings()[field] is False
            assert values.replaced({field: True}) == base.loss
        else:
            assert getattr(values, field) is False
            assert dataclasses.replace(values, **{field: True}) == getattr(base, section)
        assert cfg.capability == base.capability
    assert HACPOConfig.preset("hacpo", alpha=3.0).loss.params.alpha == 3.0
    for name in PRESETS:
        get_policy_loss(HACPOConfig.preset(name).loss_name)  # every preset names a registered loss
    with pytest.raises(ValueError, match=r"HACPOConfig\.preset\.name must be one of"):
        HACPOConfig.preset("hacpo-no-everything")


def test_dict_round_trip_and_overrides():
    cfg = HACPOConfig.preset("hacpo-no-clip", alpha=3.0, delta_step=0.01)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert HACPOConfig.from_dict(data) == cfg
    yaml_like = {"algorithm": "hacpo-no-stepwise", "loss": {"alpha": 2.0}, "capability": {"window": 10}}
    built = HACPOConfig.from_dict(yaml_like)
    assert not built.loss.params.stepwise and built.loss.params.alpha == 2.0 and built.capability.window == 10
    assert HACPOConfig.from_dict({"algorithm": "grpo"}).loss.params.eps_high == 0.28
    with pytest.raises(ValueError, match=r"PolicyLossConfig has no field\(s\) \['alpah'\]"):
        HACPOConfig.from_dict({"loss": {"alpah": 1.0}})
    with pytest.raises(ValueError, match=r"HACPOConfig has no field\(s\) \['lr'\]"):
        HACPOConfig.from_dict({"lr": 1e-6})
    with pytest.raises(ValueError, match=r"PolicyLossConfig\.params\.delta_step\)? must be >= 0"):
        HACPOConfig.from_dict({"loss": {"delta_step": -0.1}})
