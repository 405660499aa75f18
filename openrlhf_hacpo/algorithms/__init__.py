"""HACPO math on plain tensors: capability tracking, capability-aware advantages and the policy-loss registry.

Nothing here imports Ray, models or the rest of the package (the loss math itself is in ``hacpo_kernels``); see ``docs/algorithm.md`` for the formulas.
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
    get_policy_loss,
    register_policy_loss,
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
    "compute_advantages",
    "get_policy_loss",
    "register_policy_loss",
    "step_capability",
]
