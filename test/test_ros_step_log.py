"""The record of policy_step kept by the demo planner and `flashrt-bench ros`: stamps, latencies and arrivals,
without the garbage collector's work growing with the run (the messages built here need the ROS wheels, not a
ROS graph)."""
import gc

import numpy as np
import pytest

pytestmark = pytest.mark.ros  # imported inside the tests: the compat venv (make test-compat) has no ROS wheels

T0_S = 100


def policy_step(i: int):
    from flashrt_interfaces.msg import PolicyStep
    m = PolicyStep()
    m.header.stamp.sec, m.header.stamp.nanosec = T0_S + i // 100, (i % 100) * 10_000_000  # 100 Hz
    m.step_latency_ms = 0.5 + 0.001 * i
    m.capsule_id = i + 1
    return m


def test_step_log_keeps_every_stamp_and_latency_but_only_the_last_message():
    from flashrt_ros.tools.step_log import StepLog
    log = StepLog()
    log.add(policy_step(0))  # the first message imports its field types: not the log's growth
    gc.collect()
    tracked_before = len(gc.get_objects())
    for i in range(1, 5000):
        log.add(policy_step(i))  # as a subscription does: the message is the log's to keep or drop
    gc.collect()
    # keeping the messages would add ~5 tracked objects per message (25,000 here)
    assert len(gc.get_objects()) - tracked_before < 50
    stamps_ns, latency_ms = log.arrays()
    assert len(log) == 5000 and stamps_ns.dtype == np.int64 and latency_ms.dtype == np.float64
    assert stamps_ns.tolist() == [T0_S * 10**9 + i * 10_000_000 for i in range(5000)]
    assert latency_ms.tolist() == [policy_step(i).step_latency_ms for i in range(5000)]
    assert log.last.capsule_id == 5000 and log.last.step_latency_ms == latency_ms[-1]


def test_step_log_with_a_clock_gives_each_round_trip_from_its_stamp_to_its_arrival():
    from flashrt_ros.tools.step_log import StepLog
    arrivals = iter([T0_S * 10**9 + i * 10_000_000 + 1_000_000 + 1_000 * i for i in range(300)])
    log = StepLog(clock_ns=lambda: next(arrivals))
    for i in range(300):
        log.add(policy_step(i))
    assert [log.round_trip_ms(i) for i in (0, 1, 299)] == [1.0, 1.001, 1.299]
    assert log.round_trip_ms(-1) == log.round_trip_ms(299)
    with pytest.raises(ValueError, match="without a clock"):
        StepLog().round_trip_ms(0)


def test_timeline_puts_each_step_at_its_stamp_from_the_first_round():
    from flashrt_ros.tools.demo.planner import Timeline
    from flashrt_ros.tools.step_log import StepLog
    log = StepLog()
    for i in range(250):
        log.add(policy_step(i))
    timeline = Timeline()
    timeline.t0_ns = T0_S * 10**9 + 500_000_000  # the first round came half a second after the first step
    steps = timeline.summary(*log.arrays())["steps"]
    assert len(steps) == 250
    assert steps[0] == [-0.5, 0.5] and steps[50] == [0.0, 0.55] and steps[-1] == [1.99, round(0.5 + 0.249, 4)]
