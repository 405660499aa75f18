"""utils.timing.PhaseTimer: phases add up, a started phase ends once; slowest takes each phase's longest rank;
with_rest adds what a call's phases leave out."""
import time
from dataclasses import dataclass

from openrlhf_hacpo.utils.timing import PhaseTimer, slowest, with_rest


def test_phases_add_up_and_a_started_phase_ends_once():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.phase("a"):
            time.sleep(0.01)
    assert timer.seconds["a"] >= 0.02
    stop = timer.start("b")
    time.sleep(0.02)
    stop()
    first = timer.seconds["b"]
    time.sleep(0.02)
    stop()  # a second end does not count the time since the first
    assert timer.seconds["b"] == first and 0.02 <= first < 0.5
    timer.start("never ended")
    assert "never ended" not in timer.seconds


def test_slowest_is_the_longest_rank_per_phase():
    assert slowest([{"generate": 1.0, "scoring": 0.5}, {"generate": 0.25, "scoring": 2.0}, {"x": 3.0}]) == \
        {"generate": 1.0, "scoring": 2.0, "x": 3.0}


@dataclass(frozen=True)
class _Result:
    timings: dict


def test_the_rest_of_a_call_is_its_time_outside_the_timed_phases():
    started = time.perf_counter()
    timer = PhaseTimer()
    with timer.phase("update"):
        time.sleep(0.05)
    time.sleep(0.03)  # outside every phase
    result = _Result(dict(timer.seconds))
    out = with_rest(result, "train_rest", started)
    elapsed = time.perf_counter() - started
    assert out.timings["update"] == result.timings["update"] and result.timings == {"update": timer.seconds["update"]}
    assert 0.03 <= out.timings["train_rest"] <= elapsed - out.timings["update"]
    # phases that add up to more than the call (clock granularity) leave no negative rest
    assert with_rest(_Result({"update": 10.0}), "train_rest", time.perf_counter()).timings["train_rest"] == 0.0
