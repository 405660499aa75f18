"""Per-agent workers: the policy (DeepSpeed engine), the frozen reference, and the group that owns an agent's workers.

The Ray actor classes (``policy_actor_class()``, ``reference_actor_class()``) are made on first use, so importing
this package imports neither Ray nor DeepSpeed.
"""
from openrlhf_hacpo.actors.agent_group import AgentGroup, AgentWorkerDied, Pending

_LAZY = {
    "PolicyWorker": "openrlhf_hacpo.actors.policy",
    "policy_actor_class": "openrlhf_hacpo.actors.policy",
    "ReferenceWorker": "openrlhf_hacpo.actors.reference",
    "reference_actor_class": "openrlhf_hacpo.actors.reference",
}

__all__ = ["AgentGroup", "AgentWorkerDied", "Pending", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'openrlhf_hacpo.actors' has no attribute {name!r}")
