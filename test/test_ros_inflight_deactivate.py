"""Every call in flight while the node deactivates and cleans up gets an answer (issue 44, point 6): the one
running finishes, the ones queued behind it are refused naming the state; none is left unanswered."""
from __future__ import annotations

import time

import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros

CALLS = 20


def change_state_async(planner, transition_id: int):
    from lifecycle_msgs.srv import ChangeState
    client = planner.node.create_client(ChangeState, "/test/flashrt/change_state")
    assert client.wait_for_service(timeout_sec=10.0)
    req = ChangeState.Request()
    req.transition.id = transition_id
    return client.call_async(req)


def test_every_call_in_flight_during_a_deactivate_and_a_cleanup_is_answered(flashrt):
    from lifecycle_msgs.msg import Transition

    from flashrt_interfaces.srv import SetPin
    from flashrt_ros.ros.io.qos import SERVICE_QOS
    _, planner = flashrt
    for o in observation_trace(5):
        planner.step(o)
    live = planner.client.list_capsules().live_capsule_id
    pin = planner.node.create_client(SetPin, "/test/set_pin", qos_profile=SERVICE_QOS)  # as FlashRTClient's
    assert pin.wait_for_service(timeout_sec=10.0)
    futures = [pin.call_async(SetPin.Request(capsule_id=live, pin=i % 2 == 0)) for i in range(CALLS)]
    deactivate = change_state_async(planner, Transition.TRANSITION_DEACTIVATE)
    assert planner.spin_until(deactivate.done, 20.0) and deactivate.result().success
    cleanup = change_state_async(planner, Transition.TRANSITION_CLEANUP)
    assert planner.spin_until(cleanup.done, 20.0) and cleanup.result().success
    end = time.monotonic() + 20.0
    while not all(f.done() for f in futures) and time.monotonic() < end:
        planner.spin(0.05)
    answered = [f.result() for f in futures if f.done()]
    assert len(answered) == CALLS, (f"{len(answered)} of {CALLS} answered",
                                    [i for i, f in enumerate(futures) if not f.done()])
    for r in answered:
        assert r.success or "refused" in r.message or "failed" in r.message, r.message
