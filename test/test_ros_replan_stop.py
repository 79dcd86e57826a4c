"""How a long running replan ends over DDS: a cancel (answered promptly, never committing; services
are answered while the replan runs), a client that dies, a deactivation, SIGINT.

One node start-up for the module (tests run in file order; the last one stops the node). The node
allows long goals (replan_max_deadline_ms) so that a replan runs for seconds on any machine."""
import os
import subprocess
import sys
import time

import pytest
from replan_helpers import change_state, live_sha, long_goal_observations, wait_for_feedback
from ros_harness import NodeProcess, Planner, fresh_domain, ros_env

from conftest import observation_trace

# graph: long_node takes a domain; serial: a cancel and a deactivate are timed (PROMPT_S)
pytestmark = [pytest.mark.ros, pytest.mark.graph, pytest.mark.serial]
# Its own namespace: rclpy may keep endpoints of an earlier test's context in this process alive (the
# global executor holds their handles), and this module needs to know every action client of its node.
NS = "/replan_stop"
LONG = 120_000.0  # ms: the deadline of the long goals, and the node's cap
PROMPT_S = 2.0  # "promptly": a long goal runs for 20 s here (0.5 ms a step), seconds on a fast machine

VICTIM = """
import sys, rclpy, numpy as np
from flashrt_ros.ros.client import FlashRTClient
rclpy.init()
node = rclpy.create_node("victim_planner")
client = FlashRTClient(node, sys.argv[2])
client.wait_until_ready(30)
task = client.send_replan(np.zeros((1, 40000, 14), np.float32), deadline_ms=float(sys.argv[1]))
while not task.feedback:
    rclpy.spin_once(node, timeout_sec=0.05)
print("running", flush=True)
while True:
    rclpy.spin_once(node, timeout_sec=0.1)
"""


@pytest.fixture(scope="module")
def long_node(tmp_path_factory):
    import rclpy
    tmp = tmp_path_factory.mktemp("replan_stop")
    with fresh_domain() as did:
        env = ros_env(did, tmp / "roslog")
        os.environ["ROS_DOMAIN_ID"] = str(did)
        rclpy.init(domain_id=did)
        proc = NodeProcess(env, tmp / "node.log", namespace=NS, capsule_dir=str(tmp / "capsules"),
                           replan_max_deadline_ms=LONG)
        planner = Planner(namespace=NS)
        try:
            planner.wait_ready()
            planner.run(observation_trace(10))
            yield env, proc, planner
        finally:
            planner.close()
            proc.stop()
            rclpy.try_shutdown()


def test_a_service_is_answered_during_a_replan_whose_cancel_is_prompt_and_never_commits(long_node):
    from flashrt_interfaces.srv import Snapshot
    _, _, planner = long_node
    sha = live_sha(planner, "before_cancel")
    task = planner.client.send_replan(long_goal_observations(), commit_branch=0, deadline_ms=LONG)
    wait_for_feedback(planner, task)
    # the replan holds the runtime lock only for its bookkeeping: a service runs beside it
    beside = planner.client.clients["snapshot"].call_async(Snapshot.Request(label="beside"))
    assert planner.client.wait_for(beside, 10.0).success
    assert not task.is_task_complete(), "the replan ended before the service was answered: make it longer"
    t0 = time.monotonic()
    assert task.cancel(timeout_s=10.0)
    answered_s = time.monotonic() - t0
    out = task.get_result(timeout_s=30.0)
    assert answered_s < PROMPT_S, f"the cancel waited {answered_s:.1f} s"
    assert out.cancelled and not out.result.success and 0 < out.result.steps_done < 40_000, out.result.message
    assert out.result.live_capsule_id not in out.result.branch_capsule_ids
    assert live_sha(planner, "after_cancel") == sha, "a cancelled commit changed the live state"


def test_a_goal_whose_client_died_is_abandoned(long_node):
    env, proc, planner = long_node
    from flashrt_ros.ros.client import FlashRTClient
    planner.client.replan_client.destroy()  # the victim must be the last action client in the graph
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(LONG), NS], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert victim.stdout.readline().strip() == "running"
        victim.terminate()  # SIGTERM: its participant leaves the graph at once (SIGKILL: after the DDS lease)
        victim.wait(10)
        end = time.monotonic() + 20.0  # the graph's news of the departure, on a loaded machine
        while "its client is gone" not in proc.output() and time.monotonic() < end:
            time.sleep(0.05)
        log = proc.output()
        assert "stopped: its client is gone" in log and "nothing committed" in log, log[-2000:]
        assert "after 40000/40000" not in log
    finally:
        if victim.poll() is None:
            victim.kill()
    planner.client = FlashRTClient(planner.node, NS)
    planner.client.wait_until_ready(10.0)
    assert planner.client.replan(observation_trace(8)[None]).succeeded  # the node is free again


def test_deactivate_during_a_replan_answers_the_goal_at_once_and_commits_nothing(long_node):
    from action_msgs.msg import GoalStatus
    from lifecycle_msgs.msg import Transition
    _, _, planner = long_node
    sha = live_sha(planner, "before_deactivate")
    task = planner.client.send_replan(long_goal_observations(), commit_branch=0, deadline_ms=LONG)
    wait_for_feedback(planner, task)
    t0 = time.monotonic()
    assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
    took_s = time.monotonic() - t0
    out = task.get_result(timeout_s=10.0)
    assert took_s < PROMPT_S, f"deactivate took {took_s:.1f} s"
    assert out.status == GoalStatus.STATUS_ABORTED and not out.result.success and not out.result.rejected
    assert "deactivating" in out.result.message and out.result.steps_done < 40_000
    assert change_state(planner, Transition.TRANSITION_ACTIVATE)
    planner.wait_ready()
    assert live_sha(planner, "after_deactivate") == sha


def test_service_calls_in_flight_during_deactivate_are_all_answered(long_node):
    from lifecycle_msgs.msg import Transition
    from std_srvs.srv import Trigger

    from flashrt_interfaces.srv import SetPin, Snapshot
    _, _, planner = long_node
    cid = planner.client.list_capsules().live_capsule_id
    set_pin = planner.node.create_client(SetPin, f"{NS}/set_pin")
    assert set_pin.wait_for_service(timeout_sec=10)
    task = planner.client.send_replan(long_goal_observations(), deadline_ms=LONG)
    wait_for_feedback(planner, task)
    # a reset waits for the running replan (it clears the branch rows too); the calls after it are queued
    # behind it on the service worker, one at a time
    reset = planner.node.create_client(Trigger, f"{NS}/reset")
    assert reset.wait_for_service(timeout_sec=10)
    calls = [reset.call_async(Trigger.Request())]
    planner.spin(0.3)
    calls += [set_pin.call_async(SetPin.Request(capsule_id=cid, pin=k % 2 == 0)) for k in range(6)]
    calls.append(planner.client.clients["snapshot"].call_async(Snapshot.Request(label="in_flight")))
    planner.spin(0.3)
    early = [(i, c.result()) for i, c in enumerate(calls) if c.done()]  # which one, should it recur
    if early:
        task.cancel(timeout_s=10.0)  # the next tests of this node need it free
    assert not early, early
    assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
    # every call gets an answer: the one already waiting for the lock ran once the replan stopped, the
    # ones queued behind it were refused naming the state; none is left without one
    answers = [planner.client.wait_for(call, 10.0) for call in calls]
    refused = [r for r in answers if not r.success]
    assert len(refused) >= len(calls) - 1, [r.message for r in answers]
    assert all("refused: the node is deactivating" in r.message for r in refused), [r.message for r in refused]
    task.get_result(timeout_s=10.0)
    assert change_state(planner, Transition.TRANSITION_ACTIVATE)
    planner.wait_ready()
    planner.node.destroy_client(set_pin)
    assert planner.client.list_capsules().success


def test_sigint_during_a_replan_exits_0_without_errors(long_node):
    _, proc, planner = long_node
    task = planner.client.send_replan(long_goal_observations(), deadline_ms=LONG)
    wait_for_feedback(planner, task)
    t0 = time.monotonic()
    rc = proc.stop()
    took_s = time.monotonic() - t0
    log = proc.output()
    assert rc == 0 and took_s < 5.0, (rc, took_s, log[-2000:])
    assert "[ERROR]" not in log and "Traceback" not in log, log[-3000:]
