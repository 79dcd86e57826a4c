"""The standby's held observations (ROS-free): what a takeover steps, and since when the primary's record is due."""
from flashrt_ros.ros.group.held_observations import HeldObservations


def test_an_observation_that_arrives_after_its_record_is_not_held():
    held = HeldObservations()
    assert held.hold(300, 1.0, "newer", recorded_ns=200)
    assert not held.hold(200, 1.5, "stepped", recorded_ns=200)
    assert not held.hold(150, 2.0, "older", recorded_ns=200)
    assert held.after(0) == ["newer"] and held.oldest_arrival() == 1.0  # the late ones start no clock


def test_an_unstamped_observation_is_held_whatever_the_record_says():
    held = HeldObservations()
    assert held.hold(0, 1.0, "unstamped", recorded_ns=200)  # the primary stamped its step with its own clock
    assert held.oldest_arrival() == 1.0
    held.recorded(200)
    assert len(held) == 0


def test_the_record_due_clock_starts_at_the_oldest_unrecorded_observation():
    held = HeldObservations()
    assert held.hold(100, 5.0, "a", recorded_ns=None)  # no record since the source changed: held
    assert held.hold(300, 6.0, "b", recorded_ns=None)
    assert held.oldest_arrival() == 5.0
    held.recorded(100)
    assert held.oldest_arrival() == 6.0 and held.after(100) == ["b"]
    assert held.hold(400, 7.0, "c", recorded_ns=100)
    assert held.after(300) == ["c"] and held.after(0) == ["b", "c"]


def test_a_full_buffer_drops_the_oldest_and_counts_it():
    held = HeldObservations(maxlen=3)
    for i in range(5):
        held.hold(i + 1, float(i), i, recorded_ns=None)
    assert held.after(0) == [2, 3, 4] and held.overflowed == 2
