"""utils.timing.PhaseTimer: phases add up, a started phase ends once; slowest takes each phase's longest rank."""
import time

from openrlhf_hacpo.utils.timing import PhaseTimer, slowest


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
