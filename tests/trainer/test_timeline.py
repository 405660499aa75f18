"""The step timeline model against hand-computed schedules and an independent evaluation of its closed forms."""
from __future__ import annotations

import random

import pytest

from openrlhf_hacpo.trainer.timeline import (
    AgentPhases,
    Resources,
    StepPhases,
    Task,
    dispatch_from_records,
    one_step_off_step,
    phases_from_records,
    simulate,
    synchronous_step,
)

TWO_AGENTS = StepPhases((AgentPhases(generate=1.0, scoring=0.5, update=3.0, sync=0.2),
                         AgentPhases(generate=2.0, scoring=0.25, probe=0.5, update=0.25, learner_other=0.25,
                                     sync=0.3)), driver=0.1, other=0.05)


def test_two_agents_with_a_core_each_follow_the_hand_computed_schedules():
    # synchronous: rollout phase max(1 + 0.5, 2 + 0.25) = 2.25, driver 0.1, train phase max(3, 1) = 3,
    # syncs 0.2 + 0.3, bookkeeping 0.05
    assert synchronous_step(TWO_AGENTS) == pytest.approx(2.25 + 0.1 + 3.0 + 0.5 + 0.05)
    # one step off: agent 0 max(1, 0.1 + 3) + 0.5 = 3.6; agent 1 max(2, 0.1 + 1) + 0.25 = 2.25
    assert one_step_off_step(TWO_AGENTS) == pytest.approx(3.6 + 0.5 + 0.05)


def test_shared_cores_split_their_speed_between_the_running_processes():
    one = StepPhases((AgentPhases(generate=1.0, update=1.0),))
    assert one_step_off_step(one) == pytest.approx(1.0)                        # generation beside the update
    assert one_step_off_step(one, Resources.shared(1)) == pytest.approx(2.0)   # both at half speed
    assert one_step_off_step(one, Resources.shared(1.5)) == pytest.approx(4 / 3)  # both at 3/4 speed
    assert synchronous_step(one, Resources.shared(1)) == pytest.approx(2.0)    # never overlapped: unchanged

    # generation 2 s beside a 1 s update on one core: both at half speed until the update ends at 2 s, then the
    # generation's last second alone: 3 s, the whole work of the step, as the synchronous schedule takes
    longer = StepPhases((AgentPhases(generate=2.0, update=1.0),))
    assert one_step_off_step(longer, Resources.shared(1)) == pytest.approx(3.0)
    assert synchronous_step(longer, Resources.shared(1)) == pytest.approx(3.0)

    # two agents' four processes on two cores: all at half speed, 2 s, no gain over the synchronous 1 + 1
    even = StepPhases((AgentPhases(generate=1.0, update=1.0),) * 2)
    assert one_step_off_step(even, Resources.shared(2)) == pytest.approx(2.0)
    assert synchronous_step(even, Resources.shared(2)) == pytest.approx(2.0)


def test_separate_pools_contend_only_within_themselves():
    even = StepPhases((AgentPhases(generate=1.0, update=1.0),) * 2)
    # one engine slot for two engines and one policy slot for two learners: each pair takes 2 s, side by side
    assert one_step_off_step(even, Resources.separate(engine=1, policy=1)) == pytest.approx(2.0)
    assert one_step_off_step(even, Resources.separate(engine=2, policy=2)) == pytest.approx(1.0)
    # synchronous: 2 s of generation, then 2 s of training
    assert synchronous_step(even, Resources.separate(engine=1, policy=1)) == pytest.approx(4.0)


def test_simulation_with_unlimited_resources_equals_the_closed_forms():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 4)
        agents = tuple(AgentPhases(*(rng.uniform(0, 2) for _ in range(7))) for _ in range(n))
        phases = StepPhases(agents, driver=rng.uniform(0, 0.5), other=rng.uniform(0, 0.5),
                            collect=rng.uniform(0, 0.5), dispatch=rng.uniform(0, 0.5))
        g = [a.generate for a in agents]
        s = [a.scoring + a.rollout_rest for a in agents]
        l_ = [a.learner_other + a.probe + a.update for a in agents]
        y = sum(a.sync for a in agents)
        c, d, e, o = phases.collect, phases.driver, phases.dispatch, phases.other
        assert synchronous_step(phases) == pytest.approx(
            max(gk + sk for gk, sk in zip(g, s)) + c + d + e + max(l_) + y + o)
        assert one_step_off_step(phases) == pytest.approx(
            max(max(gk, d + e + lk) + sk for gk, lk, sk in zip(g, l_, s)) + c + y + o)


def test_on_one_core_both_schedules_take_the_whole_work_of_the_step():
    """Processor sharing on one core never idles while work is left: overlap cannot help there."""
    rng = random.Random(1)
    for _ in range(50):
        agents = tuple(AgentPhases(*(rng.uniform(0, 2) for _ in range(7))) for _ in range(rng.randint(1, 3)))
        phases = StepPhases(agents, driver=rng.uniform(0, 0.2), other=rng.uniform(0, 0.2),
                            collect=rng.uniform(0, 0.2), dispatch=rng.uniform(0, 0.2))
        total = sum(a.generate + a.scoring + a.rollout_rest + a.learn + a.sync for a in agents) + phases.driver \
            + phases.other + phases.collect + phases.dispatch
        assert one_step_off_step(phases, Resources.shared(1)) == pytest.approx(total)
        assert synchronous_step(phases, Resources.shared(1)) == pytest.approx(total)


def test_sharing_cores_can_erase_the_gain_of_the_overlap():
    """Two cores and an agent whose scoring is long: overlapped, its generation shares the cores with every learner
    and its scoring, on the critical path, starts later than in the synchronous step. By hand: one step off, generation (1 s) and update (1 s) share the two cores with agent b's generation (1 s)
    and update (1 s): four processes, all at half speed, end at 2 s; the scorings (2 s and 0) follow: 4 s.
    Synchronous: generation 1 s (two processes), scoring 2 s, update 1 s: 4 s. Equal here; with a third agent
    (three processes per phase, 2/3 speed) the synchronous step is 1.5 + 2 + 1.5 = 5 s and the overlap's six
    processes run at 1/3 speed for 3 s, then the 2 s scoring: 5 s."""
    a = AgentPhases(generate=1.0, scoring=2.0, update=1.0)
    b = AgentPhases(generate=1.0, update=1.0)
    two = StepPhases((a, b))
    assert synchronous_step(two, Resources.shared(2)) == pytest.approx(4.0)
    assert one_step_off_step(two, Resources.shared(2)) == pytest.approx(4.0)
    three = StepPhases((a, b, b))
    assert synchronous_step(three, Resources.shared(2)) == pytest.approx(5.0)
    assert one_step_off_step(three, Resources.shared(2)) == pytest.approx(5.0)
    # with a core per process the overlap hides the whole update: max(1, 1) + 2 = 3 s against 1 + 2 + 1
    assert one_step_off_step(two) == pytest.approx(3.0) and synchronous_step(two) == pytest.approx(4.0)


def test_simulate_rejects_broken_task_graphs():
    with pytest.raises(ValueError, match="'b'.*not a task"):
        simulate([Task("a", "policy", 1.0, ("b",))], Resources())
    with pytest.raises(ValueError, match="cycle"):
        simulate([Task("a", "policy", 1.0, ("b",)), Task("b", "policy", 1.0, ("a",))], Resources())
    with pytest.raises(ValueError, match="twice"):
        simulate([Task("a", "policy", 1.0), Task("a", "engine", 1.0)], Resources())


def test_bad_costs_and_resources_are_named():
    with pytest.raises(ValueError, match="AgentPhases.update"):
        AgentPhases(generate=1.0, update=-0.1)
    with pytest.raises(ValueError, match="AgentPhases.generate"):
        AgentPhases(generate=float("nan"))
    with pytest.raises(ValueError, match="StepPhases.agents"):
        StepPhases(())
    with pytest.raises(ValueError, match="StepPhases.dispatch"):
        StepPhases((AgentPhases(generate=1.0),), dispatch=-1.0)
    with pytest.raises(ValueError, match="Resources.shared_pool"):
        Resources.shared(0)


def test_phases_from_metrics_records():
    records = [
        {"step": 3, "agent": "a", "time/generate": 0.4, "time/scoring": 0.1, "time/view": 0.01,
         "time/advantages": 0.02, "time/reference": 0.03, "time/probe": 0.05, "time/update": 0.3, "time/sync": 0.0,
         "time/reward": 0.004, "time/capability": 0.001, "time/rollout_rest": 0.007, "time/train_rest": 0.02},
        {"step": 3, "agent": "b", "time/generate": 0.2, "time/scoring": 0.05, "time/update": 0.2,
         "time/reward": 0.004, "time/capability": 0.001},
    ]
    phases = phases_from_records(records)
    first = phases.agents[0]
    assert (first.generate, first.scoring, first.probe, first.update, first.sync) == (0.4, 0.1, 0.05, 0.3, 0.0)
    assert first.learner_other == pytest.approx(0.08)  # view + advantages + reference + the rest of the call
    assert first.rollout_rest == 0.007 and first.score == pytest.approx(0.107)
    assert phases.agents[1].learn == pytest.approx(0.2) and phases.agents[1].probe == 0.0
    assert phases.driver == pytest.approx(0.005)
    with pytest.raises(ValueError, match="step 4 agent 'c'"):
        phases_from_records([{"step": 4, "agent": "c", "time/update": 1.0}])


def test_dispatch_is_each_phase_less_its_longest_process():
    records = [
        {"step": 3, "agent": "a", "time/generate": 0.4, "time/scoring": 0.1, "time/rollout_rest": 0.01,
         "time/update": 0.3, "time/train_rest": 0.02, "time/rollout_phase": 0.6, "time/train_phase": 0.45},
        {"step": 3, "agent": "b", "time/generate": 0.2, "time/scoring": 0.05, "time/update": 0.35,
         "time/rollout_phase": 0.6, "time/train_phase": 0.45},
    ]
    # collect: 0.6 - max(0.4 + 0.1 + 0.01, 0.2 + 0.05); dispatch: 0.45 - max(0.3 + 0.02, 0.35)
    assert dispatch_from_records(records) == (pytest.approx(0.09), pytest.approx(0.1))
    # phases shorter than their processes' costs (clocks of different processes) give no negative dispatch
    short = [{**r, "time/rollout_phase": 0.1, "time/train_phase": 0.1} for r in records]
    assert dispatch_from_records(short) == (0.0, 0.0)
