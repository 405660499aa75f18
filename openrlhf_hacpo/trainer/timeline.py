"""A training step's wall time from the costs of its phases, for two schedules.

**Synchronous** (what :meth:`~openrlhf_hacpo.trainer.controller.HACPOController.train_one_step` runs): every agent
generates and scores its own rollouts (concurrently), the driver verifies the rewards and updates the capability
tracker, every learner trains (concurrently), then the weights go to each agent's engines in turn::

    T_sync = max_k (g_k + s_k) + c + d + e + max_k l_k + Σ_k y_k + o

**One step off** (generation of step t+1 runs while the learners train on step t, as in verl's one-step-off
recipe): at the start of a step the engines begin generating the next batch with the weights synced at the end of
the previous step while the driver scores the current batch and the learners train on it; each learner then scores
the next batch's own rollouts with its new weights (they need both the engine's rollouts and the finished update),
and the step ends with the weight sync::

    T_off = max_k ( max(g_k, d + e + l_k) + s_k ) + c + Σ_k y_k + o

with, per agent k, g_k its generation, s_k its scoring pass (old log-probs of its own rollouts) and the rest of its
rollout call, l_k its learner's whole call (view, advantages, reference, probe, update and the rest), y_k its weight
sync; d the driver's work between the two phases (reward, capability), o its bookkeeping after the sync, and the
two phases' dispatch, which no process's timed work covers: c collecting the rollouts (their results serialized,
sent and read by the driver), e sending the step's trajectories to the learners (put in the object store, read by
each learner before its call starts, the results returned). The formulas hold when every process runs at full
speed (generation on resources of its own). When processes share cores, the step is simulated under processor
sharing (:class:`Resources`): while more processes of a pool run than it has room for, each advances at
capacity / running of its full speed. The synchronous schedule never runs an agent's generation and its learner at
once, so sharing changes it only where the processes of one phase already outnumber the cores.

Costs are the seconds each phase takes when its process runs alone at full speed: on a CPU run with at least as many
cores as busy processes (the tiny preset: two agents on two cores), the trainer's own ``time/*`` metrics
(:func:`phases_from_records`); the dispatch c and e from a phase's measured length less its processes' costs
(:func:`dispatch_from_records`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

__all__ = ["AgentPhases", "Resources", "StepPhases", "Task", "dispatch_from_records", "one_step_off_step",
           "one_step_off_tasks", "phases_from_records", "simulate", "synchronous_step", "synchronous_tasks"]


def _check_seconds(owner: str, values: Mapping[str, float]) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{owner}.{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class AgentPhases:
    """One agent's phase costs in a step (seconds at full speed).

    Attributes:
        generate: sampling its rollouts (``time/generate``).
        scoring: the old-log-prob pass over its own rollouts (``time/scoring``).
        probe: its learner's pass deciding which foreign rows have a gradient (``time/probe``).
        update: its learner's forward and backward passes and optimizer steps (``time/update``).
        sync: sending its weights to its engines (``time/sync``; 0 when it generates in the policy).
        learner_other: the rest of its learner's train phase: view, advantages, reference pass and the rest of the
            learner's call (``time/train_rest``: planning, metric reductions, results).
        rollout_rest: the rest of its policy's rollout call after scoring (``time/rollout_rest``: results built).
    """

    generate: float
    scoring: float = 0.0
    probe: float = 0.0
    update: float = 0.0
    sync: float = 0.0
    learner_other: float = 0.0
    rollout_rest: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds("AgentPhases", {f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def learn(self) -> float:
        """The learner's train phase: ``learner_other + probe + update``."""
        return self.learner_other + self.probe + self.update

    @property
    def score(self) -> float:
        """The policy's part of the rollout after generation: ``scoring + rollout_rest`` (s_k of the formulas)."""
        return self.scoring + self.rollout_rest


@dataclass(frozen=True)
class StepPhases:
    """A step's costs: each agent's phases, the driver's work between the rollout and train phases (``driver``:
    reward and capability) and after the sync (``other``), and the dispatch of the two phases (``collect``: c,
    reading the rollouts; ``dispatch``: e, the trajectories to the learners and their results back)."""

    agents: tuple[AgentPhases, ...]
    driver: float = 0.0
    other: float = 0.0
    collect: float = 0.0
    dispatch: float = 0.0

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("StepPhases.agents is empty: a step has at least one agent")
        object.__setattr__(self, "agents", tuple(self.agents))
        _check_seconds("StepPhases", {"driver": self.driver, "other": self.other, "collect": self.collect,
                                      "dispatch": self.dispatch})


@dataclass(frozen=True)
class Resources:
    """How many processes of each pool run at full speed at once (None: as many as there are).

    Pools: ``engine`` (generation), ``policy`` (scoring, learning, sync) and ``driver``. :meth:`unlimited` gives
    every process its own cores (the closed forms); :meth:`shared` puts every process on one set of ``cores``
    (single-threaded processes: a capacity of ``cores``); :meth:`separate` gives generation and training pools of
    their own.
    """

    engine: float | None = None
    policy: float | None = None
    driver: float | None = None
    shared_pool: float | None = None
    """When set, every process draws from this one pool and the per-pool capacities are ignored."""

    def __post_init__(self) -> None:
        for name in ("engine", "policy", "driver", "shared_pool"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0 or not math.isfinite(value)):
                raise ValueError(f"Resources.{name} must be a positive number of processes or None, got {value!r}")

    @classmethod
    def unlimited(cls) -> "Resources":
        return cls()

    @classmethod
    def shared(cls, cores: float) -> "Resources":
        return cls(shared_pool=cores)

    @classmethod
    def separate(cls, engine: float | None, policy: float | None) -> "Resources":
        return cls(engine=engine, policy=policy)

    def pool_of(self, pool: str) -> str:
        return "shared" if self.shared_pool is not None else pool

    def capacity(self, pool: str) -> float | None:
        return self.shared_pool if pool == "shared" else getattr(self, pool)


@dataclass(frozen=True)
class Task:
    """One phase of one process: ``work`` seconds at full speed, in ``pool``, after every task in ``after``."""

    name: str
    pool: str
    work: float
    after: tuple[str, ...] = ()


def simulate(tasks: Sequence[Task], resources: Resources) -> dict[str, tuple[float, float]]:
    """Start and end of every task under processor sharing: a task starts when everything it comes after has ended;
    while the running tasks of a pool outnumber its capacity c, each advances at c / running of its full speed.

    Raises ValueError for a task that names an unknown one, a repeated name or a cycle.
    """
    by_name: dict[str, Task] = {}
    for task in tasks:
        if task.name in by_name:
            raise ValueError(f"task {task.name!r} appears twice")
        by_name[task.name] = task
    for task in tasks:
        for dependency in task.after:
            if dependency not in by_name:
                raise ValueError(f"task {task.name!r} comes after {dependency!r}, which is not a task")
    left = {task.name: float(task.work) for task in tasks}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    now = 0.0
    while len(ended) < len(by_name):
        running = [name for name in by_name if name not in ended
                   and all(dependency in ended for dependency in by_name[name].after)]
        if not running:
            raise ValueError(f"the tasks {sorted(set(by_name) - set(ended))} wait on each other (a cycle)")
        for name in running:
            started.setdefault(name, now)
        finished = [name for name in running if left[name] <= 0.0]
        if finished:
            for name in finished:
                ended[name] = now
            continue
        count: dict[str, int] = {}
        for name in running:
            pool = resources.pool_of(by_name[name].pool)
            count[pool] = count.get(pool, 0) + 1
        rate = {}
        for name in running:
            pool = resources.pool_of(by_name[name].pool)
            capacity = resources.capacity(pool)
            rate[name] = 1.0 if capacity is None else min(1.0, capacity / count[pool])
        step = min(left[name] / rate[name] for name in running)
        now += step
        for name in running:
            left[name] -= step * rate[name]
            if left[name] <= 1e-12 * max(1.0, by_name[name].work):
                left[name] = 0.0
    return {name: (started[name], ended[name]) for name in by_name}


def _makespan(tasks: Sequence[Task], resources: Resources) -> float:
    return max(end for _, end in simulate(tasks, resources).values())


def _sync_chain(phases: StepPhases, after: tuple[str, ...]) -> list[Task]:
    """The weight syncs one agent after another (as the controller runs them), then the driver's bookkeeping."""
    tasks, previous = [], after
    for k, agent in enumerate(phases.agents):
        tasks.append(Task(f"sync{k}", "policy", agent.sync, previous))
        previous = (f"sync{k}",)
    tasks.append(Task("other", "driver", phases.other, previous))
    return tasks


def synchronous_tasks(phases: StepPhases) -> list[Task]:
    """The phases of one synchronous step and their order (module docstring)."""
    n = len(phases.agents)
    tasks = []
    for k, agent in enumerate(phases.agents):
        tasks.append(Task(f"generate{k}", "engine", agent.generate))
        tasks.append(Task(f"scoring{k}", "policy", agent.score, (f"generate{k}",)))
    tasks.append(Task("collect", "driver", phases.collect, tuple(f"scoring{k}" for k in range(n))))
    tasks.append(Task("driver", "driver", phases.driver, ("collect",)))
    tasks.append(Task("dispatch", "driver", phases.dispatch, ("driver",)))
    tasks += [Task(f"learn{k}", "policy", agent.learn, ("dispatch",)) for k, agent in enumerate(phases.agents)]
    return tasks + _sync_chain(phases, tuple(f"learn{k}" for k in range(n)))


def one_step_off_tasks(phases: StepPhases) -> list[Task]:
    """The phases of one step of the one-step-off schedule in its steady state (module docstring)."""
    n = len(phases.agents)
    tasks = [Task("driver", "driver", phases.driver), Task("dispatch", "driver", phases.dispatch, ("driver",))]
    for k, agent in enumerate(phases.agents):
        tasks.append(Task(f"generate{k}", "engine", agent.generate))
        tasks.append(Task(f"learn{k}", "policy", agent.learn, ("dispatch",)))
        tasks.append(Task(f"scoring{k}", "policy", agent.score, (f"generate{k}", f"learn{k}")))
    tasks.append(Task("collect", "driver", phases.collect, tuple(f"scoring{k}" for k in range(n))))
    return tasks + _sync_chain(phases, ("collect",))


def synchronous_step(phases: StepPhases, resources: Resources | None = None) -> float:
    """Seconds of one synchronous step; without ``resources`` (every process at full speed) this is
    ``max_k (g_k + s_k) + c + d + e + max_k l_k + Σ_k y_k + o``."""
    return _makespan(synchronous_tasks(phases), resources or Resources.unlimited())


def one_step_off_step(phases: StepPhases, resources: Resources | None = None) -> float:
    """Seconds of one step of the one-step-off schedule in its steady state; without ``resources`` this is
    ``max_k (max(g_k, d + e + l_k) + s_k) + c + Σ_k y_k + o``."""
    return _makespan(one_step_off_tasks(phases), resources or Resources.unlimited())


_AGENT_KEYS = {"generate": "time/generate", "scoring": "time/scoring", "probe": "time/probe",
               "update": "time/update", "sync": "time/sync", "rollout_rest": "time/rollout_rest"}
_LEARNER_OTHER = ("time/view", "time/advantages", "time/reference", "time/train_rest")


def phases_from_records(records: Sequence[Mapping[str, float]]) -> StepPhases:
    """A step's costs from its per-agent ``metrics.jsonl`` records (one per agent, in agent order): each agent's
    ``time/generate``, ``time/scoring``, ``time/rollout_rest``, ``time/probe``, ``time/update``, ``time/sync`` and
    ``time/view`` + ``time/advantages`` + ``time/reference`` + ``time/train_rest``; the driver's ``time/reward`` +
    ``time/capability``. A key a record lacks counts 0 (a trainer that did not log it); a record without
    ``time/generate`` raises ValueError naming it.
    """
    if not records:
        raise ValueError("phases_from_records: no records")
    agents = []
    for record in records:
        if "time/generate" not in record:
            raise ValueError(f"the record of step {record.get('step')} agent {record.get('agent')!r} has no "
                             "time/generate: not a training step's record")
        seconds = {key: float(record.get(key, 0.0)) for key in (*_AGENT_KEYS.values(), *_LEARNER_OTHER)}
        agents.append(AgentPhases(**{field: seconds[key] for field, key in _AGENT_KEYS.items()},
                                  learner_other=sum(seconds[key] for key in _LEARNER_OTHER)))
    first = records[0]
    driver = float(first.get("time/reward", 0.0)) + float(first.get("time/capability", 0.0))
    return StepPhases(tuple(agents), driver=driver)


def dispatch_from_records(records: Sequence[Mapping[str, float]]) -> tuple[float, float]:
    """The two phases' dispatch of a synchronous step (``collect``, ``dispatch``), from its per-agent records: the
    driver's measured rollout phase (``time/rollout_phase``: its wait from the calls sent to the results read) less
    max_k (g_k + s_k), and its train phase (``time/train_phase``) less max_k l_k, each at least 0."""
    phases = phases_from_records(records)
    first = records[0]
    collect = float(first["time/rollout_phase"]) - max(a.generate + a.score for a in phases.agents)
    dispatch = float(first["time/train_phase"]) - max(a.learn for a in phases.agents)
    return max(collect, 0.0), max(dispatch, 0.0)
