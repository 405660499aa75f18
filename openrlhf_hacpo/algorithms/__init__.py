"""HACPO math on plain tensors: capability tracking, capability-aware advantages and the policy-loss registry.

Nothing here imports Ray, models or the rest of the package; see ``docs/algorithm.md`` for the formulas.
"""
from .advantages import AdvantageOutput, compute_advantages
from .capability import CapabilityTracker, capability_ratios, step_capability
from .config import (
    ALGORITHMS,
    PRESETS,
    AdvantageConfig,
    CapabilityConfig,
    HACPOConfig,
    PolicyLossConfig,
)
from .losses import (
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossInput,
    PolicyLossOutput,
    clamp_log_ratio,
    cross_objective,
    get_policy_loss,
    low_var_kl,
    register_policy_loss,
    self_clip_objective,
)

__all__ = [
    "ALGORITHMS",
    "PRESETS",
    "AdvantageConfig",
    "AdvantageOutput",
    "CapabilityConfig",
    "CapabilityTracker",
    "HACPOConfig",
    "POLICY_LOSSES",
    "PolicyLossConfig",
    "PolicyLossFn",
    "PolicyLossInput",
    "PolicyLossOutput",
    "capability_ratios",
    "clamp_log_ratio",
    "compute_advantages",
    "cross_objective",
    "get_policy_loss",
    "low_var_kl",
    "register_policy_loss",
    "self_clip_objective",
    "step_capability",
]
