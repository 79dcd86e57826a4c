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
