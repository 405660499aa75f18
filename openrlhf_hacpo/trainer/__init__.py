"""The controller's step loop, checkpoints, metric sinks and evaluation (the run configuration is
:mod:`openrlhf_hacpo.config`, one layer below the actors)."""

_LAZY = {
    "HACPOController": "openrlhf_hacpo.trainer.controller",
    "TrainingError": "openrlhf_hacpo.trainer.controller",
    "CheckpointManager": "openrlhf_hacpo.trainer.checkpoint",
    "MetricsLogger": "openrlhf_hacpo.trainer.metrics",
    "Evaluator": "openrlhf_hacpo.trainer.evaluation",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'openrlhf_hacpo.trainer' has no attribute {name!r}")
