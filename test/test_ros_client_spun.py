"""FlashRTClient made on a node that another thread's executor already spins (no flashrt node needed)."""
import threading
import time

import pytest

pytestmark = pytest.mark.ros


def test_a_client_made_while_another_thread_spins_its_node_leaves_that_executor_spinning(ros_domain):
    """rclpy's ActionClient joins the node, waking the executor, before it has made its lock. An executor
    that looked at it in that window raised AttributeError and its spin thread died: no answer reached the
    node again (the client then timed out, "discovered but does not answer"). Here the thread making the
    client is descheduled right after the join, as on a loaded machine, so the executor always looks."""
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    from flashrt_ros.ros.client import FlashRTClient

    class DescheduledAfterJoining(Node):
        def add_waitable(self, waitable):
            super().add_waitable(waitable)
            time.sleep(0.2)  # the executor wakes, rebuilds its wait set with the new waitable

    node = DescheduledAfterJoining("spun_elsewhere")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    died = []
    default_hook = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    try:
        spinner.start()
        FlashRTClient(node, "/nowhere")
        time.sleep(0.2)
        assert spinner.is_alive() and not died, f"the executor's spin thread died: {died}"
    finally:
        executor.shutdown()
        spinner.join(5)
        threading.excepthook = default_hook
        node.destroy_node()


def test_a_repeatable_call_left_unanswered_is_sent_again_and_a_state_changing_one_is_not(ros_domain):
    """A server just discovered can drop a response (its writer has not matched the client yet). Here a
    stand-in server answers its first request of each service only after the caller gave up on it: the
    read (list_capsules) is asked again and answered; a snapshot is sent once, whatever happens."""
    import rclpy
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor

    from flashrt_interfaces.srv import ListCapsules, Snapshot
    from flashrt_ros.ros.client import RESEND_AFTER_S, FlashRTClient, FlashRTTimeout

    seen = {"list_capsules": 0, "snapshot": 0}

    def late_first(name):
        def answer(request, response):
            seen[name] += 1
            if seen[name] == 1:
                time.sleep(RESEND_AFTER_S + 1.0)  # the caller has moved on: as good as a lost response
            response.success = name == "list_capsules"
            return response
        return answer

    server = rclpy.create_node("stand_in", namespace="/stand_in")
    group = ReentrantCallbackGroup()
    for name, srv in (("list_capsules", ListCapsules), ("snapshot", Snapshot)):
        server.create_service(srv, name, late_first(name), callback_group=group)
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(server)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    caller = rclpy.create_node("caller")
    try:
        client = FlashRTClient(caller, "/stand_in")
        t0 = time.monotonic()
        assert client.list_capsules(timeout_s=RESEND_AFTER_S + 3.0).success
        assert seen["list_capsules"] == 2 and time.monotonic() - t0 < RESEND_AFTER_S + 1.0
        with pytest.raises(FlashRTTimeout, match="snapshot"):
            client.snapshot(label="once", timeout_s=RESEND_AFTER_S + 0.5)
        time.sleep(1.5)  # a second request, had one been sent, has reached the server by now
        assert seen["snapshot"] == 1
    finally:
        executor.shutdown()
        spinner.join(10)
        caller.destroy_node()
        server.destroy_node()


def test_a_goal_answered_before_rclpy_registers_its_future_still_completes(ros_domain):
    """rclpy sends a goal request, then registers the future its answer completes (Jazzy: outside any lock;
    9.1: once more after its lock). A client node that an executor spins on another thread could take the
    answer in between: it was dropped and the replan ended in FlashRTTimeout. Here every registration is
    held up 0.3 s, as on a loaded machine, so the answer is always there first."""
    import numpy as np
    import rclpy
    from rclpy.action import ActionServer
    from rclpy.executors import SingleThreadedExecutor

    from flashrt_interfaces.action import Replan
    from flashrt_ros.ros.client import FlashRTClient, FlashRTTimeout

    class LateRegistrations(dict):
        def __setitem__(self, key, value):
            time.sleep(0.3)
            super().__setitem__(key, value)

    def execute(goal_handle):
        goal_handle.succeed()
        return Replan.Result(success=True)

    server = rclpy.create_node("stand_in", namespace="/stand_in")
    action_server = ActionServer(server, Replan, "replan", execute_callback=execute)
    caller = rclpy.create_node("caller")
    executors, spinners = [], []
    for node in (server, caller):
        executors.append(SingleThreadedExecutor())
        executors[-1].add_node(node)
        spinners.append(threading.Thread(target=executors[-1].spin, daemon=True))
        spinners[-1].start()
    try:
        client = FlashRTClient(caller, "/stand_in")
        assert client.spun_elsewhere() and client.replan_client.wait_for_server(timeout_sec=10)
        for _ in range(10):  # until the server's answers reach this client (discovery)
            try:
                client.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=1.0)
                break
            except FlashRTTimeout:
                pass
        client.replan_client._pending_goal_requests = LateRegistrations()
        for _ in range(3):
            outcome = client.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=5.0)
            assert outcome.accepted and outcome.succeeded
    finally:
        for executor, spinner in zip(executors, spinners):
            executor.shutdown()
            spinner.join(5)
        action_server.destroy()
        caller.destroy_node()
        server.destroy_node()
