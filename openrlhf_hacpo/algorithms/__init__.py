"""HACPO math on plain tensors: capability tracking, capability-aware advantages and the policy-loss registry.

Nothing here imports Ray, models or the rest of the package (the loss math itself is in ``hacpo_kernels``); see ``docs/algorithm.md`` for the formulas.
"""
from .advantages import AdvantageOutput, compute_advantages
from .capability import CapabilityRatios, CapabilityStep, CapabilityTracker, capability_ratios, step_capability
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
    LossTotals,
    PolicyLoss,
    PolicyLossInput,
    PolicyLossOutput,
    check_policy_input,
    get_policy_loss,
)

__all__ = [
    "ALGORITHMS",
    "PRESETS",
    "AdvantageConfig",
    "AdvantageOutput",
    "CapabilityConfig",
    "CapabilityRatios",
    "CapabilityStep",
    "CapabilityTracker",
    "HACPOConfig",
    "LossTotals",
    "POLICY_LOSSES",
    "PolicyLoss",
    "PolicyLossConfig",
    "PolicyLossInput",
    "PolicyLossOutput",
    "capability_ratios",
    "check_policy_input",
    "compute_advantages",
    "get_policy_loss",
    "step_capability",
]
