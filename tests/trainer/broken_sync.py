"""A weight sync that does not reach an ``hf_engine`` engine, for the tests that must see it named or corrected.

:func:`engines_keep_their_weights` wraps the driver's ``AgentGroup.sync_weights``: before an agent's first sync it
takes a copy of its engines' tensors (the given names, or all of them), and after every sync it puts them back inside
the engine actors (``__ray_call__``), so the engine keeps what it held before training, as if the sync had never sent
those tensors. The functions run inside the engine actors are local to the wrapper, so Ray ships them by value.
"""
from __future__ import annotations

from typing import Sequence


def engines_keep_their_weights(monkeypatch, tensors: Sequence[str] | None = None, agent: str | None = None) -> None:
    """Patch ``AgentGroup.sync_weights`` so that the engines of ``agent`` (every agent with engines when ``None``)
    keep their initial value of ``tensors`` (every tensor of the model when ``None``: an adapter that never reached
    the engine, the base model's weights kept)."""
    import ray

    from openrlhf_hacpo.actors.agent_group import AgentGroup

    def keep(engine_actor, names):
        """Inside the engine actor: a copy of the model's tensors ``names`` (all when ``None``)."""
        state = engine_actor.engine.model.state_dict()
        return {k: v.detach().clone() for k, v in state.items() if names is None or k in names}

    def restore(engine_actor, values):
        """Inside the engine actor: put the kept ``values`` back into the model's tensors."""
        import torch

        state = engine_actor.engine.model.state_dict()
        with torch.no_grad():
            for name, value in values.items():
                state[name].copy_(value)

    real_sync = AgentGroup.sync_weights
    kept: dict[str, list] = {}

    def sync(group):
        if not group.engines or (agent is not None and group.name != agent):
            return real_sync(group)
        if group.name not in kept:  # before the first sync: the engines hold the initial weights
            kept[group.name] = [ray.get(e.__ray_call__.remote(keep, tensors)) for e in group.engines]
        seconds = real_sync(group)
        ray.get([e.__ray_call__.remote(restore, v) for e, v in zip(group.engines, kept[group.name])])
        return seconds

    monkeypatch.setattr(AgentGroup, "sync_weights", sync)
