"""Lifecycle transitions, and the surfaces that exist only while active."""
import time

import pytest
from ros_harness import NodeProcess, Planner

from conftest import observation_trace

pytestmark = pytest.mark.ros


def change_state(planner, transition_id: int) -> bool:
    from lifecycle_msgs.srv import ChangeState
    cli = planner.node.create_client(ChangeState, "/test/flashrt/change_state")
    assert cli.wait_for_service(timeout_sec=20)
    req = ChangeState.Request()
    req.transition.id = transition_id
    return planner.client._spin_until(cli.call_async(req), 20).success


def get_state(planner) -> str:
    from lifecycle_msgs.srv import GetState
    cli = planner.node.create_client(GetState, "/test/flashrt/get_state")
    assert cli.wait_for_service(timeout_sec=20)
    return planner.client._spin_until(cli.call_async(GetState.Request()), 10).current_state.label


def serving(planner, expect: bool, timeout: float = 10.0) -> bool:
    """Wait for the graph to show the snapshot service (dis)appearing."""
    cli = planner.client.clients["snapshot"]
    end = time.monotonic() + timeout
    while cli.service_is_ready() != expect and time.monotonic() < end:
        planner.spin(0.05)
    return cli.service_is_ready()


def test_configure_activate_deactivate_activate_serves_only_while_active(ros_domain, tmp_path):
    from lifecycle_msgs.msg import Transition
    proc = NodeProcess(ros_domain, tmp_path / "node.log", autostart=False)
    planner = Planner()
    try:
        assert get_state(planner) == "unconfigured"
        assert not serving(planner, True, timeout=2.0)
        assert change_state(planner, Transition.TRANSITION_CONFIGURE) and get_state(planner) == "inactive"
        assert not serving(planner, True, timeout=2.0)
        assert change_state(planner, Transition.TRANSITION_ACTIVATE) and get_state(planner) == "active"
        planner.wait_ready()
        obs = observation_trace(20)
        planner.run(obs[:5])
        assert change_state(planner, Transition.TRANSITION_DEACTIVATE) and get_state(planner) == "inactive"
        assert not serving(planner, False)
        n = len(planner.steps)
        from ros_harness import joint_state
        planner.publish(joint_state(obs[5], 1))
        planner.spin(0.5)
        assert len(planner.steps) == n, "an inactive node must not step"
        assert change_state(planner, Transition.TRANSITION_ACTIVATE)
        planner.wait_ready()
        assert planner.step(obs[5]).step == 6  # the state survived deactivation
        assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
        assert change_state(planner, Transition.TRANSITION_CLEANUP) and get_state(planner) == "unconfigured"
    finally:
        planner.close()
        assert proc.stop() == 0
        assert "Traceback" not in proc.output()


def test_bad_configuration_fails_the_transition_with_a_reason(ros_domain, tmp_path):
    proc = NodeProcess(ros_domain, tmp_path / "node.log", n_heads=3)
    try:
        proc.proc.wait(30)
        out = proc.output()
        assert proc.proc.returncode == 1 and "n_heads" in out and "configure failed" in out, out
        assert "Traceback" not in out
    finally:
        proc.stop()
