"""Per-agent workers: the policy (DeepSpeed engine), the frozen reference, and the group that owns an agent's workers.

The Ray actor classes (``PolicyActor``, ``ReferenceActor``) are imported on first use so that importing this package
does not start importing DeepSpeed or Ray.
"""
from openrlhf_hacpo.actors.agent_group import AgentGroup, AgentWorkerDied, Pending

_LAZY = {
    "PolicyWorker": "openrlhf_hacpo.actors.policy",
    "PolicyActor": "openrlhf_hacpo.actors.policy",
    "ReferenceWorker": "openrlhf_hacpo.actors.reference",
    "ReferenceActor": "openrlhf_hacpo.actors.reference",
}

__all__ = ["AgentGroup", "AgentWorkerDied", "Pending", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'openrlhf_hacpo.actors' has no attribute {name!r}")
