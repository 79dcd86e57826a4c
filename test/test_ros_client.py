"""FlashRTClient against a real node: non-blocking goal handles, a node spun by its own executor, named
service methods with None for "none", one failure style (FlashRTTimeout for no answer, responses for
every answer). One node start-up."""
import threading
import time

import numpy as np
import pytest
from replan_helpers import long_goal_observations, wait_for_feedback

from conftest import observation_trace

pytestmark = pytest.mark.ros


@pytest.fixture
def node_params():
    return {"replan_max_deadline_ms": 60_000.0}


def test_client_goal_handles_named_services_and_failures(flashrt, tmp_path):
    from flashrt_ros.ros.client import FlashRTClient, FlashRTTimeout
    _, planner = flashrt
    client = planner.client
    obs = observation_trace(30)
    planner.run(obs[:20])

    # --- a goal handle never blocks: sent, polled, fetched; actions come shaped ---
    # the longest deadline the node allows: this checks the handle, not the machine's speed
    task = client.send_replan(np.stack([obs[20:26], obs[22:28]]), capsule_id=None, commit_branch=None,
                              deadline_ms=60_000.0)
    assert not task.is_task_complete()  # nothing was waited for yet
    end = time.monotonic() + 20
    while not task.is_task_complete():
        assert time.monotonic() < end
    out = task.get_result()
    assert out.accepted and out.succeeded and out.result.steps_done == 6
    assert out.actions().shape == (2, 6, 7) and out.actions().dtype == np.float32
    # feedback starts 20 ms into a replan: one that ends sooner sends only its result (1 x 2: a few ms)
    # (until one is that fast: a loaded machine's stall may stretch a few)
    short = []
    while len(short) < 20 and not any(o.result.elapsed_ms < 10.0 for o in short):
        short.append(client.replan(obs[None, 20:22]))
    assert all(o.succeeded for o in short)
    fast = [o for o in short if o.result.elapsed_ms < 10.0]
    assert fast, [o.result.elapsed_ms for o in short]
    assert all(o.feedback == [] for o in fast), [(o.result.elapsed_ms, len(o.feedback)) for o in fast]
    # ...and cancel() stops a running one, which then says so
    task = client.send_replan(long_goal_observations(), deadline_ms=60_000.0)
    wait_for_feedback(planner, task)
    assert task.cancel()
    out = task.get_result(timeout_s=20.0)
    assert out.cancelled and not out.succeeded and out.actions().shape[1] == out.result.steps_done < 40_000
    assert not task.cancel()  # already over

    # --- a named method per service; None is the wire's "none"; failures come back as responses ---
    snap = client.snapshot(label="keep", pin=True)
    assert snap.success and snap.capsule.pinned
    assert [c.id for c in client.list_capsules(pinned_only=True).capsules] == [snap.capsule.id]
    r = client.rollback(capsule_id=None, steps_back=3)
    assert r.success and r.capsule.step == 17, r.message
    exp = client.export_capsule("live.safetensors", capsule_id=None)
    assert exp.success and (tmp_path / "capsules" / "live.safetensors").exists()
    imp = client.import_capsule("live.safetensors", restore=False)
    assert imp.success and imp.capsule.step == 17
    assert client.drop_capsule(imp.capsule.id).success
    bad = client.drop_capsule(424242)
    assert not bad.success and "424242" in bad.message
    assert client.reset().success
    services = dict(planner.node.get_service_names_and_types())
    if "/test/unpin" in services or "/test/set_pin" in services:  # nodes that have one
        unpinned = client.unpin(snap.capsule.id)
        assert unpinned.success and not unpinned.capsule.pinned, unpinned.message
    else:
        with pytest.raises(FlashRTTimeout, match="unpin"):
            client.unpin(snap.capsule.id, timeout_s=0.5)

    # an optional service is found in the graph, its type imported from the name the graph gives
    from flashrt_interfaces.srv import DropCapsule

    def fake_unpin(request, response):
        response.success, response.message = True, f"unpinned {request.capsule_id}"
        return response
    planner.node.create_service(DropCapsule, "/fake/unpin", fake_unpin)
    assert FlashRTClient(planner.node, "/fake").unpin(5).message == "unpinned 5"

    # --- no answer raises FlashRTTimeout, whatever was asked ---
    nobody = FlashRTClient(planner.node, "/nobody")
    with pytest.raises(FlashRTTimeout, match="not available"):
        nobody.wait_until_ready(0.5)
    with pytest.raises(FlashRTTimeout, match="snapshot"):
        nobody.snapshot(timeout_s=0.3)
    with pytest.raises(FlashRTTimeout):
        nobody.send_replan(np.stack([obs[:2]])).get_result(timeout_s=0.5)


def test_client_works_from_a_node_its_own_executor_spins_and_leaves_it_there(flashrt):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from flashrt_ros.ros.client import FlashRTClient
    _, planner = flashrt
    planner.run(observation_trace(5))
    node = rclpy.create_node("spun_planner")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        client = FlashRTClient(node, "/test")
        client.wait_until_ready(20.0)
        assert client.snapshot(label="from a spun node").success
        out = client.replan(observation_trace(8)[None], deadline_ms=None)
        assert out.succeeded and out.actions().shape == (1, 8, 7)
        task = client.send_replan(observation_trace(4)[None])
        assert task.get_result(timeout_s=10.0).succeeded and task.is_task_complete()
        assert node in executor.get_nodes()  # the client waited on futures; it never took the node over
    finally:
        executor.shutdown()
        spinner.join(5)
        node.destroy_node()


def test_timed_out_requests_are_cancelled_and_nothing_stays_pending(flashrt):
    """A node that stops answering (SIGSTOP: its services and action stay discovered): every call times
    out, and neither the service clients nor the action client keep the unanswered request."""
    import os
    import signal

    from flashrt_ros.ros.client import FlashRTTimeout
    proc, planner = flashrt
    client = planner.client
    planner.run(observation_trace(3))
    os.kill(proc.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(FlashRTTimeout):
            client.snapshot(label="never answered", timeout_s=0.5)
        with pytest.raises(FlashRTTimeout):
            client.rollback(steps_back=1, timeout_s=0.5)
        task = client.send_replan(observation_trace(4)[None])
        with pytest.raises(FlashRTTimeout):
            task.get_result(timeout_s=0.5)
        pending = {name: dict(c._pending_requests) for name, c in client.clients.items()}
        assert pending == {name: {} for name in client.clients}
        assert client.replan_client._pending_goal_requests == {}
        assert client.replan_client._pending_result_requests == {}
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
    assert client.snapshot(label="answered again").success  # a late answer to a forgotten request is ignored
    assert not task.is_task_complete()  # given up: the late goal response is not recorded
