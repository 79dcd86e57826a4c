"""The standby's stall clock (issue 18, point 3), ROS-free: the time its own process stood still is not time the
primary was silent."""
from __future__ import annotations

import pytest

from flashrt_ros.ros.group.stall_clock import StallClock

TICK = 0.02


def _ticked(times) -> StallClock:
    clock = StallClock(times[0], TICK)
    for t in times[1:]:
        clock.tick(t)
    return clock


def test_regular_ticks_are_no_stall():
    clock = _ticked([i * TICK for i in range(50)])
    assert clock.stalled_s(0.0, 49 * TICK) == 0.0


def test_a_gap_counts_beyond_two_ticks():
    clock = _ticked([0.0, 0.02, 0.04, 0.44, 0.46])  # stood still from 0.04 to 0.44
    assert clock.stalled_s(0.0, 0.46) == pytest.approx(0.4 - 2 * TICK)


def test_only_the_part_of_a_stall_inside_the_window_counts():
    clock = _ticked([0.0, 1.0, 1.02])  # stood still from 0.04 to 1.0
    assert clock.stalled_s(0.5, 1.02) == pytest.approx(0.5)
    assert clock.stalled_s(1.0, 1.02) == 0.0


def test_the_gap_since_the_last_tick_counts_before_the_ticker_ran_again():
    clock = _ticked([0.0, 0.02])
    assert clock.stalled_s(0.0, 0.52) == pytest.approx(0.5 - 2 * TICK)  # a callback on resuming, first in line


def test_a_window_longer_than_a_second_sees_every_stall_in_it():
    times = [i * TICK for i in range(200)] + [8.0 + i * TICK for i in range(200)]  # 4 s of ticks, a 4 s stall
    clock = _ticked(times)
    assert clock.stalled_s(0.0, times[-1]) == pytest.approx(8.0 - 199 * TICK - 2 * TICK)
    assert clock.stalled_s(times[-1] - 1.0, times[-1]) == 0.0
