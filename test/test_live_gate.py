"""LiveGate: observations held during a replan are stepped in order, none lost, the oldest dropped
first past HELD_MAX, and counted."""
import pytest

pytest.importorskip("rclpy")

from flashrt_ros.ros.replan_server import HELD_MAX, LiveGate  # noqa: E402

pytestmark = pytest.mark.ros


def test_nothing_is_held_while_no_replan_runs():
    assert LiveGate().hold("a") == (False, False)


def test_held_observations_are_stepped_in_order_by_the_replan_then_by_finish():
    gate, stepped = LiveGate(), []
    gate.start()
    assert gate.hold("a") == (True, False) and gate.hold("b") == (True, False)
    stepped += gate.take()  # between two batched steps
    assert gate.hold("c") == (True, False)  # arrives during the last batched step
    gate.finish(stepped.append)
    assert stepped == ["a", "b", "c"]
    assert gate.hold("d") == (False, False)  # the executor steps directly again


def test_past_the_limit_the_oldest_held_observation_gives_way():
    gate = LiveGate()
    gate.start()
    results = [gate.hold(k) for k in range(HELD_MAX + 2)]
    assert [dropped for _, dropped in results] == [False] * HELD_MAX + [True, True]
    assert gate.take() == list(range(2, HELD_MAX + 2))
