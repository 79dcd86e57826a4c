"""The replan goal's final status from its result (replan_server.close_goal, no ROS graph): what a client's
get_result sees, as Replan.action promises it. The goal handle is a stand-in that records the one status set."""
from __future__ import annotations

import pytest

from flashrt_interfaces.action import Replan
from flashrt_ros.ros.services.replan import close_goal


class GoalHandle:
    """The part of rclpy's ServerGoalHandle that close_goal uses: a status may be set once."""

    def __init__(self, cancel_requested: bool):
        self.is_cancel_requested = cancel_requested
        self.statuses: list[str] = []

    def succeed(self):
        self.statuses.append("SUCCEEDED")

    def canceled(self):
        self.statuses.append("CANCELED")

    def abort(self):
        self.statuses.append("ABORTED")


def status_of(result: Replan.Result, cancel_requested: bool) -> list[str]:
    handle = GoalHandle(cancel_requested)
    close_goal(handle, result)
    return handle.statuses


@pytest.mark.parametrize("cancel_requested", [False, True])
def test_a_rejected_goal_is_aborted_even_when_its_client_cancelled_it_before_the_answer(cancel_requested):
    rejected = Replan.Result(success=False, rejected=True, message="rejected: capsule 7 is not held")
    assert status_of(rejected, cancel_requested) == ["ABORTED"]


def test_a_goal_a_cancel_stopped_is_canceled():
    assert status_of(Replan.Result(success=False, message="cancelled after 2 steps"), True) == ["CANCELED"]


def test_a_goal_that_ran_succeeds_even_when_the_cancel_came_after_it_had_finished():
    assert status_of(Replan.Result(success=True), True) == ["SUCCEEDED"]
    assert status_of(Replan.Result(success=True), False) == ["SUCCEEDED"]


def test_a_goal_the_node_stopped_without_a_cancel_is_aborted():
    assert status_of(Replan.Result(success=False, message="stopped: the node is deactivating"), False) == ["ABORTED"]
