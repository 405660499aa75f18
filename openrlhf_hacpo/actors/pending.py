"""Work started on an agent's workers and how waiting on it fails: a dead worker or a phase over the timeout.

:class:`Pending` holds the Ray object references of one call on several workers (or, without Ray, the values
themselves); :meth:`Pending.result` waits at most the group's ``timeout_s`` and combines the workers' results into
one value. A Ray actor that died surfaces as :class:`AgentWorkerDied`, a wait over the timeout as
:class:`AgentPhaseTimeout`, each naming the agent, the worker's role and the phase.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

__all__ = ["AgentPhaseTimeout", "AgentWorkerDied", "Pending", "is_actor_death"]


class AgentWorkerDied(RuntimeError):
    """A Ray actor of an agent died (process crash, OOM kill, node loss)."""

    def __init__(self, agent: str, role: str, detail: str) -> None:
        self.agent = agent
        self.role = role
        super().__init__(f"the {role} of agent {agent!r} died: {detail}")


class AgentPhaseTimeout(TimeoutError):
    """An agent's workers did not finish a phase within the step timeout (hung, stopped or far too slow)."""

    def __init__(self, agent: str, role: str, phase: str, timeout_s: float) -> None:
        self.agent, self.role, self.phase, self.timeout_s = agent, role, phase, timeout_s
        super().__init__(f"the {role} of agent {agent!r} did not finish {phase} within {timeout_s:g} s "
                         "(--step_timeout); it is hung, stopped or much slower than expected")


# worker method -> phase named in timeout messages
_PHASES = {"setup": "setup", "get_master_addr_port": "setup",
           "set_reference": "setup", "rollout": "generate", "generate": "generate", "score_engine_outputs": "score",
           "render": "prompt rendering", "render_prompts": "prompt rendering",
           "render_prompt_texts": "prompt rendering", "train_step": "update",
           "sync_weights_to_engines": "sync", "init_engine_weight_sync": "sync", "save_checkpoint": "save",
           "load_checkpoint": "load", "save_hf": "save", "state_dict_for_sync": "sync", "sleep": "engine sleep",
           "wake_up": "engine wake-up"}


def is_actor_death(err: BaseException) -> bool:
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return isinstance(err, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError))


T = TypeVar("T")


class Pending(Generic[T]):
    """Work started on an agent's workers; :meth:`result` waits and combines the per-worker results into one ``T``
    (``Pending[RolloutResult]``, ``Pending[TrainStepResult]``, ...).

    ``after`` is work this one depends on, started already (e.g. the engines' generation that a scoring call takes
    as its input): :meth:`result` waits for it first, so a timeout names the phase that hung, and hands its value
    to ``combine`` as a second argument.
    """

    def __init__(self, group: Any, role: str, parts: list[Any], combine: Callable[..., T],
                 remote: bool, method: str = "", after: "Pending[Any] | None" = None) -> None:
        self.group, self.role, self.parts, self.combine, self.remote = group, role, parts, combine, remote
        self.method = method
        self.after = after

    def result(self) -> T:
        """Wait (at most the group's ``timeout_s`` per phase) and combine the workers' results."""
        if self.after is not None:
            first = self.after.result()
            return self.combine(self._values(), first)
        return self.combine(self._values())

    def _values(self) -> list[Any]:
        if not self.remote:
            return self.parts
        import ray
        import ray.exceptions as rex

        timeout = self.group.timeout_s
        try:
            values = ray.get(self.parts, timeout=timeout)
        except rex.GetTimeoutError as err:
            phase = _PHASES.get(self.method, self.method or "its work")
            raise AgentPhaseTimeout(self.group.name, self.role, phase, timeout) from err
        except Exception as err:
            if is_actor_death(err):
                raise AgentWorkerDied(self.group.name, self.role, str(err).splitlines()[0]) from err
            raise
        return values
