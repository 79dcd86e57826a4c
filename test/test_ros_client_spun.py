"""FlashRTClient made on a node that another thread's executor already spins (no flashrt node needed)."""
import contextlib
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
    spinner = _spin_on_a_thread(server, executor)
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


def _spin_on_a_thread(node, executor) -> threading.Thread:
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    return spinner


class LateRegistrations(dict):
    """A pending-request table whose every registration is held up 0.3 s, as on a loaded machine."""

    def __setitem__(self, key, value):
        time.sleep(0.3)
        super().__setitem__(key, value)


@pytest.fixture(params=["SingleThreadedExecutor", "MultiThreadedExecutor"])
def stand_in_replan(ros_domain, request):
    """A FlashRTClient of a stand-in Replan server that succeeds at once; both nodes spun by executors on
    threads of their own (the client's of either kind: a multi-threaded one takes answers on one thread and
    runs their callbacks, which send the next request, on others), the server's answers already reaching
    the client (discovery done)."""
    import numpy as np
    import rclpy
    from rclpy import executors as rclpy_executors
    from rclpy.action import ActionServer
    from rclpy.executors import SingleThreadedExecutor

    from flashrt_interfaces.action import Replan
    from flashrt_ros.ros.client import FlashRTClient, FlashRTTimeout

    def execute(goal_handle):
        goal_handle.succeed()
        return Replan.Result(success=True)

    server = rclpy.create_node("stand_in", namespace="/stand_in")
    action_server = ActionServer(server, Replan, "replan", execute_callback=execute)
    caller = rclpy.create_node("caller")
    executors, spinners = [], []
    for node, kind in ((server, SingleThreadedExecutor), (caller, getattr(rclpy_executors, request.param))):
        executors.append(kind())
        executors[-1].add_node(node)
        spinners.append(threading.Thread(target=executors[-1].spin, daemon=True))
        spinners[-1].start()
    try:
        client = FlashRTClient(caller, "/stand_in")
        assert client.spun_elsewhere() and client.replan_client.wait_for_server(timeout_sec=10)
        for _ in range(10):
            try:
                client.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=1.0)
                break
            except FlashRTTimeout:
                pass
        else:
            pytest.fail("the stand-in server's answers never reached the client (discovery), before any delay")
        yield client
    finally:
        for executor, spinner in zip(executors, spinners):
            executor.shutdown()
            spinner.join(5)
        action_server.destroy()
        caller.destroy_node()
        server.destroy_node()


def test_a_goal_answered_before_rclpy_registers_its_future_still_completes(stand_in_replan):
    """rclpy sends a request, then registers the future its answer completes: in some releases outside any
    lock (the Jazzy wheels here), in others once inside its lock and again after it (9.1). A client node that
    an executor spins on another thread could take the answer in between: it was dropped ("Ignoring
    unexpected goal response") or completed a future nobody holds, and the replan ended in FlashRTTimeout.
    Here every goal and result registration is held up, so the answer is always there first."""
    import numpy as np

    action_client = stand_in_replan.replan_client
    action_client._pending_goal_requests = LateRegistrations()
    action_client._pending_result_requests = LateRegistrations()
    for _ in range(3):
        outcome = stand_in_replan.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=5.0)
        assert outcome.accepted and outcome.succeeded


def test_an_answered_goal_leaves_no_future_behind_in_the_action_client(stand_in_replan):
    """rclpy 9.1 registers a goal's first future and then replaces it: the first is never completed, so never
    removed from the client's futures, and every wake of the client walks that list (one more per goal, for
    as long as the planner runs)."""
    import numpy as np

    for _ in range(5):
        assert stand_in_replan.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=5.0).succeeded
    futures = stand_in_replan.replan_client._futures
    end = time.monotonic() + 2.0
    while futures and time.monotonic() < end:  # the last answer's own futures go in the executor's next task
        time.sleep(0.05)
    assert futures == [], f"{len(futures)} futures left after every goal was answered"


@contextlib.contextmanager
def _stand_in_server(goal_callback):
    """A FlashRTClient (spun by its own waits) of a stand-in Replan server, spun on a thread, that decides each
    goal with goal_callback and succeeds at once; yielded once its answers reach the client."""
    import numpy as np
    import rclpy
    from rclpy.action import ActionServer
    from rclpy.executors import SingleThreadedExecutor

    from flashrt_interfaces.action import Replan
    from flashrt_ros.ros.client import FlashRTClient, FlashRTTimeout

    def execute(goal_handle):
        goal_handle.succeed()
        return Replan.Result(success=True)

    server = rclpy.create_node("stand_in", namespace="/stand_in")
    action_server = ActionServer(server, Replan, "replan", execute_callback=execute, goal_callback=goal_callback)
    executor = SingleThreadedExecutor()
    spinner = _spin_on_a_thread(server, executor)
    caller = rclpy.create_node("caller")
    try:
        client = FlashRTClient(caller, "/stand_in")
        assert client.replan_client.wait_for_server(timeout_sec=10)
        for _ in range(10):  # until an answer came back (discovery of the response writer)
            with contextlib.suppress(FlashRTTimeout):
                client.send_replan(np.zeros((1, 1, 4), np.float32)).get_result(timeout_s=2.0)
                break
        else:
            pytest.fail("the stand-in server's answers never reached the client")
        yield client
    finally:
        executor.shutdown()
        spinner.join(5)
        action_server.destroy()
        caller.destroy_node()
        server.destroy_node()


def test_refused_goals_leave_no_feedback_callback_and_no_observations_behind_in_the_client(ros_domain):
    # rclpy drops a goal's feedback callback with its result; a goal refused (busy) never gets one, and the
    # callback held its task and the goal's observations for as long as the planner ran
    import numpy as np
    import rclpy
    from rclpy.action import GoalResponse

    with _stand_in_server(lambda goal: GoalResponse.REJECT) as client:
        for _ in range(20):
            out = client.send_replan(np.zeros((4, 8, 14), np.float32)).get_result(timeout_s=5.0)
            assert not out.accepted and "busy" in out.reason
        rclpy.spin_once(client.node, timeout_sec=0.1)  # anything still queued for the client
        assert client.replan_client._feedback_callbacks == {}


def test_a_cancel_that_times_out_before_the_goal_response_leaves_the_goal_watchable(ros_domain):
    # the cancel's wait for the goal response gave the response up: the goal still ran (and could commit),
    # and get_result() could never see it
    import numpy as np
    from rclpy.action import GoalResponse

    from flashrt_ros.ros.client import FlashRTTimeout

    def accept_late(goal):
        time.sleep(1.0)
        return GoalResponse.ACCEPT

    with _stand_in_server(accept_late) as client:
        task = client.send_replan(np.zeros((1, 1, 4), np.float32), commit_branch=0)
        with pytest.raises(FlashRTTimeout, match="goal response"):
            task.cancel(timeout_s=0.3)
        out = task.get_result(timeout_s=10.0)
        assert out.accepted and out.succeeded
