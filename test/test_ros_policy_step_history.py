"""policy_step's transient-local history on a real node: a late subscriber gets the recent steps of the
live timeline (a client's first answer survives the DDS match, step_link), and never steps of a timeline
that was left: not after a rollback, a reset, a restoring import or a committed replan, and nothing while
the node is inactive."""
import time

import pytest
from replan_helpers import change_state

from conftest import observation_trace

pytestmark = pytest.mark.ros

DEACTIVATE, ACTIVATE = 4, 3  # lifecycle_msgs/Transition ids


class LateSubscriber:
    def __init__(self, planner):
        from flashrt_interfaces.msg import PolicyStep
        from flashrt_ros.ros.io.step_link import policy_step_qos
        self.planner, self.steps = planner, []
        self.sub = planner.node.create_subscription(PolicyStep, f"{planner.namespace}/policy_step",
                                                    self.steps.append, policy_step_qos())

    def wait_for(self, n: int, timeout: float = 10.0) -> list:
        end = time.monotonic() + timeout
        while len(self.steps) < n and time.monotonic() < end:
            self.planner.spin(0.01)
        return [m.step for m in self.steps]

    def close(self) -> None:
        self.planner.node.destroy_subscription(self.sub)


def _first_steps_after(planner, late, obs):
    """Step once more; what the late subscriber gets up to and including that step (stale history first)."""
    step = planner.step(obs).step
    got = late.wait_for(1)
    while got[-1] != step:
        got = late.wait_for(len(got) + 1)
    late.close()
    return got, step


def test_late_subscribers_get_only_steps_of_the_live_timeline(flashrt, tmp_path):
    _, planner = flashrt
    obs = observation_trace(20)
    planner.run(obs[:5])
    late = LateSubscriber(planner)
    assert late.wait_for(5) == [1, 2, 3, 4, 5]  # the recent steps of the live timeline: kept for late joiners
    late.close()

    assert planner.client.rollback(steps_back=2).success
    got, step = _first_steps_after(planner, LateSubscriber(planner), obs[5])
    assert got == [step] == [4]  # nothing from before the rollback

    planner.run(obs[6:9])
    assert planner.client.reset().success
    got, step = _first_steps_after(planner, LateSubscriber(planner), obs[9])
    assert got == [step] == [1]

    planner.run(obs[10:12])
    assert planner.client.export_capsule("c.safetensors").success
    planner.run(obs[12:14])
    assert planner.client.import_capsule("c.safetensors", restore=True).success
    got, step = _first_steps_after(planner, LateSubscriber(planner), obs[14])
    assert got == [step] == [4]

    planner.run(obs[15:17])
    assert change_state(planner, DEACTIVATE)
    late = LateSubscriber(planner)  # joins while the node is inactive
    planner.spin(0.5)  # gives a stale history every chance to arrive; the check below does not rely on it
    assert change_state(planner, ACTIVATE)
    planner.client.wait_until_ready(20.0)
    got, step = _first_steps_after(planner, late, obs[17])
    assert got == [step] == [7]
