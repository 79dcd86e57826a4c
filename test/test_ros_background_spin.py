"""tools.common.BackgroundSpin: a tool's executor thread. After stop(), an error from a last spin_once (on a loaded
machine the join gives up and the node's handles go under it: rclpy's InvalidHandle) is the stop, not a traceback;
before stop() it is an error like any other (flashrt-demo's planner printed one in a loaded make test)."""
from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.ros  # imports rclpy; no graph


class _Executor:
    """Spins until released, then fails as rclpy does when the node was destroyed under it."""

    def __init__(self):
        self.release = threading.Event()

    def add_node(self, node):
        pass

    def spin(self):
        self.release.wait(10.0)
        raise RuntimeError("cannot use Destroyable because destruction was requested")

    def shutdown(self, timeout_sec=None):
        return False  # the last spin_once outlived it


@pytest.mark.parametrize("stopped", [True, False])
def test_an_error_under_a_stopped_spin_is_the_stop_and_one_before_it_is_raised(monkeypatch, stopped):
    import rclpy.executors

    from flashrt_ros.tools.common import BackgroundSpin
    monkeypatch.setattr(rclpy.executors, "SingleThreadedExecutor", _Executor)
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda a: raised.append(a.exc_value))
    spin = BackgroundSpin(object(), "test_spin")
    if stopped:
        spin.stop(timeout_s=0.01)
    spin.executor.release.set()
    spin.thread.join(10.0)
    assert not spin.is_alive()
    assert [str(e) for e in raised] == ([] if stopped else ["cannot use Destroyable because destruction was requested"])
