"""Work started on an agent's workers and how waiting on it fails: a dead worker or a phase over the timeout.

:class:`Pending` holds the Ray object references of one call on several workers (or, without Ray, the values
themselves); :meth:`Pending.result` waits at most the group's ``timeout_s`` and combines the workers' results into
one value. A Ray actor that died surfaces as :class:`AgentWorkerDied`, a wait over the timeout as
:class:`AgentPhaseTimeout`, each naming the agent, the worker (role and rank or engine index), its node and the
phase.

A rank that dies inside a collective (its node lost, its process killed) makes its peers fail too, with an error of
their own (gloo's "Connection reset by peer"), which may reach the driver first. When one of several workers fails
with an error that is not a death, :meth:`Pending.result` therefore asks each worker of the call whether it is still
alive (:func:`lost_workers`) and reports a dead one as the cause; when all answer, the error is raised unchanged.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

__all__ = ["AgentPhaseTimeout", "AgentWorkerDied", "Pending", "WorkerRef", "death_error", "identify_worker",
           "is_actor_death", "lost_workers", "phase_of"]


@dataclass(frozen=True)
class WorkerRef:
    """One worker of an agent: its role (``policy``, ``reference``, ``vLLM engine``, ``HF engine``), its rank
    (policy) or engine index (None for the reference), and the node it runs on when known."""

    role: str
    index: int | None = None
    node: str | None = None

    @property
    def name(self) -> str:
        """``policy rank 1``, ``vLLM engine 0``, ``reference``."""
        if self.index is None:
            return self.role
        return f"{self.role} rank {self.index}" if self.role == "policy" else f"{self.role} {self.index}"


class AgentWorkerDied(RuntimeError):
    """A Ray actor of an agent died (process crash, OOM kill, node loss).

    Attributes: ``agent``, ``role``, ``rank`` (policy rank or engine index; None when unknown or for the
    reference), ``node`` (address, host and node id when known), ``phase`` (``update``, ``generate``, ``save`` ...;
    None when unknown) and ``detail`` (Ray's reason).
    """

    def __init__(self, agent: str, role: str, detail: str, rank: int | None = None, node: str | None = None,
                 phase: str | None = None) -> None:
        self.agent, self.role, self.detail = agent, role, detail
        self.rank, self.node, self.phase = rank, node, phase
        worker = WorkerRef(role, rank, node)
        where = f" on node {node}" if node else ""
        during = f" during {phase}" if phase else ""
        super().__init__(f"the {worker.name} of agent {agent!r}{where} died{during}: {detail}")


class AgentPhaseTimeout(TimeoutError):
    """An agent's workers did not finish a phase within the step timeout (hung, stopped or far too slow).

    Attributes as :class:`AgentWorkerDied` (``rank`` and ``node`` of the first worker that had not finished), plus
    ``timeout_s``.
    """

    def __init__(self, agent: str, role: str, phase: str, timeout_s: float, rank: int | None = None,
                 node: str | None = None) -> None:
        self.agent, self.role, self.phase, self.timeout_s = agent, role, phase, timeout_s
        self.rank, self.node = rank, node
        where = f" on node {node}" if node else ""
        super().__init__(f"the {WorkerRef(role, rank, node).name} of agent {agent!r}{where} did not finish {phase} "
                         f"within {timeout_s:g} s (--step_timeout); it is hung, stopped or much slower than expected")


# worker method -> phase named in error messages
_PHASES = {"setup": "setup", "get_master_addr_port": "setup",
           "set_reference": "setup", "rollout": "generate", "generate": "generate",
           "last_generate_seconds": "generate", "score_engine_outputs": "score",
           "render": "prompt rendering", "render_prompts": "prompt rendering",
           "render_prompt_texts": "prompt rendering", "train_step": "update",
           "train_own_rows_first": "update", "train_finish": "update",
           "sync_weights_to_engines": "sync", "init_engine_weight_sync": "sync", "save_checkpoint": "save",
           "load_checkpoint": "load", "save_hf": "save", "state_dict_for_sync": "sync", "sleep": "engine sleep",
           "wake_up": "engine wake-up"}

LOST_WORKER_PROBE_S = 30.0
"""How long :func:`lost_workers` waits for a dead worker to be reported after a peer's error: Ray marks the actors
of a lost node dead once its health checks fail (seconds to tens of seconds)."""


def phase_of(method: str) -> str:
    """The phase a worker method belongs to (``train_step`` -> ``update``)."""
    return _PHASES.get(method, method or "its work")


def is_actor_death(err: BaseException) -> bool:
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return isinstance(err, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError))


def _actor_hex(actor: Any) -> str | None:
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else None


def identify_worker(group: Any, actor: Any = None, actor_id: str | None = None) -> WorkerRef | None:
    """The role, index and node of one of ``group``'s actors, found by handle or by hex actor id; None if it is not
    one of them. The node comes from ``group.worker_nodes`` (filled from the placement records)."""
    wanted = actor_id or (_actor_hex(actor) if actor is not None else None)
    if wanted is None:
        return None
    nodes = getattr(group, "worker_nodes", {}) or {}
    plan = getattr(group, "plan", None)
    engine_role = plan.engine_role if plan is not None else "vLLM engine"
    candidates = [("policy", r, a) for r, a in enumerate(getattr(group, "policies", []))]
    if getattr(group, "reference", None) is not None:
        candidates.append(("reference", None, group.reference))
    candidates += [(engine_role, i, a) for i, a in enumerate(getattr(group, "engines", []))]
    for role, index, handle in candidates:
        if _actor_hex(handle) == wanted:
            return WorkerRef(role, index, nodes.get(wanted))
    return None


def _death_detail(err: BaseException) -> tuple[str, str | None]:
    """Ray's reason for an actor death in a few words, and the node address the message names (``ip: ...``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    ip = next((m.group(1) for line in lines for m in [re.match(r"ip:\s*(\S+)", line)] if m), None)
    fields = re.compile(r"^(class_name|actor_id|pid|name|namespace|ip):")
    reasons = [line for line in lines[1:] if not fields.match(line)]
    reason = reasons[0] if reasons else lines[0] if lines else type(err).__name__
    # Ray's reason goes on with exit codes and a list of possible causes: its first sentence says what happened
    first = re.match(r"(.+?\.)(\s|$)", reason)
    return (first.group(1) if first else reason), ip


def death_error(group: Any, default: WorkerRef, err: BaseException, phase: str | None) -> AgentWorkerDied:
    """:class:`AgentWorkerDied` for a Ray actor-death error, naming the worker by the error's actor id."""
    found = identify_worker(group, actor_id=getattr(err, "actor_id", None)) or default
    detail, ip = _death_detail(err)
    return AgentWorkerDied(group.name, found.role, detail, found.index, found.node or ip, phase)


def lost_workers(group: Any, workers: Sequence[Any], timeout_s: float = LOST_WORKER_PROBE_S,
                 ) -> list[tuple[WorkerRef, BaseException]]:
    """The workers among ``workers`` that Ray reports dead, each with Ray's error; waits at most ``timeout_s`` and
    returns as soon as one is found dead or every worker has answered (a worker busy with the failed call answers
    after it, and counts as alive while it has not answered)."""
    import ray

    probes: dict[Any, Any] = {}
    dead: list[tuple[WorkerRef, BaseException]] = []
    for actor in workers:
        ref = identify_worker(group, actor) or WorkerRef("worker")
        try:
            probes[actor.__ray_ready__.remote()] = ref  # Ray's own no-op method of every actor
        except Exception as err:  # noqa: BLE001 - submitting to a dead actor can raise at once
            if not is_actor_death(err):
                raise
            dead.append((ref, err))
    deadline = time.monotonic() + timeout_s
    waiting = list(probes)
    while waiting and not dead:
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
        if not ready:
            break
        try:
            ray.get(ready[0])
        except Exception as err:  # noqa: BLE001 - only deaths are collected
            if is_actor_death(err):
                dead.append((probes[ready[0]], err))
    return dead


T = TypeVar("T")


class Pending(Generic[T]):
    """Work started on an agent's workers; :meth:`result` waits and combines the per-worker results into one ``T``
    (``Pending[RolloutResult]``, ``Pending[TrainStepResult]``, ...).

    ``after`` is work this one depends on, started already (e.g. the engines' generation that a scoring call takes
    as its input): :meth:`result` waits for it first, so a timeout names the phase that hung, and hands its value
    to ``combine`` as a second argument. ``workers`` are the actors that produce ``parts`` (in the same order), so a
    failure names the worker at fault.
    """

    def __init__(self, group: Any, role: str, parts: list[Any], combine: Callable[..., T],
                 remote: bool, method: str = "", after: "Pending[Any] | None" = None,
                 workers: Sequence[Any] | None = None) -> None:
        self.group, self.role, self.parts, self.combine, self.remote = group, role, parts, combine, remote
        self.method = method
        self.after = after
        self.workers = list(workers) if workers is not None else None

    def result(self) -> T:
        """Wait (at most the group's ``timeout_s`` per phase) and combine the workers' results."""
        if self.after is not None:
            first = self.after.result()
            return self.combine(self._values(), first)
        return self.combine(self._values())

    def _worker(self, index: int) -> WorkerRef:
        actor = self.workers[index] if self.workers is not None and index < len(self.workers) else None
        found = identify_worker(self.group, actor) if actor is not None else None
        return found or WorkerRef(self.role, None)

    def _values(self) -> list[Any]:
        if not self.remote:
            return self.parts
        import ray
        import ray.exceptions as rex

        timeout = self.group.timeout_s
        phase = phase_of(self.method)
        try:
            values = ray.get(self.parts, timeout=timeout)
        except rex.GetTimeoutError as err:
            _, unfinished = ray.wait(self.parts, num_returns=len(self.parts), timeout=0)
            first = self.parts.index(unfinished[0]) if unfinished else -1
            worker = self._worker(first) if first >= 0 else WorkerRef(self.role, None)
            raise AgentPhaseTimeout(self.group.name, worker.role, phase, timeout, worker.index, worker.node) from err
        except Exception as err:
            if is_actor_death(err):
                raise death_error(self.group, WorkerRef(self.role, None), err, phase) from err
            if self.workers is not None and len(self.workers) > 1:
                dead = lost_workers(self.group, self.workers)
                if dead:
                    worker, death = dead[0]
                    detail, ip = _death_detail(death)
                    raise AgentWorkerDied(self.group.name, worker.role, f"{detail}; its peers then failed with "
                                          f"{_first_line(err)}", worker.index, worker.node or ip, phase) from err
            raise
        return values


def _first_line(err: BaseException) -> str:
    """An error's own message, first line, without the remote traceback Ray prepends to a task's error."""
    cause = getattr(err, "cause", None)
    if type(err).__name__.startswith("RayTaskError") and isinstance(cause, BaseException):
        err = cause
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
