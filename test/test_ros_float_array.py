"""observation_type float32_array on a real node: a Float32MultiArray with leading padding
(layout.data_offset) is refused, never read shifted; the state is untouched."""
import time

import numpy as np
import pytest
from ros_harness import Diagnostics, NodeProcess, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros


class FloatPlanner:
    """A planner that publishes Float32MultiArray observations (the harness's Planner publishes JointState,
    and one process cannot publish both types on one topic)."""

    def __init__(self):
        import rclpy
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import Float32MultiArray

        from flashrt_interfaces.msg import PolicyStep
        from flashrt_ros.ros.client import FlashRTClient
        from flashrt_ros.ros.io.step_link import policy_step_qos
        self.rclpy, self.namespace = rclpy, "/test"
        self.node = rclpy.create_node("float_planner")
        self.client = FlashRTClient(self.node, "/test")
        self.steps: list = []
        self.step_sub = self.node.create_subscription(PolicyStep, "/test/policy_step", self.steps.append,
                                                      policy_step_qos(100))
        self.pub = self.node.create_publisher(Float32MultiArray, "/test/observation",
                                              QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.rclpy.spin_once(self.node, timeout_sec=0.01)


@pytest.fixture
def float_node(ros_domain, tmp_path):
    from flashrt_ros.ros.io.step_link import wait_linked
    proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"),
                       observation_type="float32_array")
    planner = FloatPlanner()
    try:
        planner.client.wait_until_ready(30.0)
        wait_linked(planner.node, planner.pub, planner.step_sub, 30.0)
        yield planner
    finally:
        planner.node.destroy_node()
        assert proc.stop() == 0, proc.output()[-3000:]


def test_a_nonzero_data_offset_is_refused_and_the_next_array_steps_from_an_untouched_state(float_node):
    from std_msgs.msg import Float32MultiArray
    planner = float_node
    diags = Diagnostics(planner)
    ref = reference_session()
    obs = observation_trace(2)
    # obs_dim values in all, the first two of them padding: read from index 0 they would step shifted
    padded = Float32MultiArray(data=[9.0, 9.0, *obs[0][:12].tolist()])
    padded.layout.data_offset = 2
    planner.pub.publish(padded)
    _, values = diags.until(lambda v: v["rejected_inputs"] == "1")
    assert values["steps"] == "0"
    planner.pub.publish(Float32MultiArray(data=obs[1].tolist()))
    end = time.monotonic() + 10
    while not planner.steps and time.monotonic() < end:
        planner.spin(0.01)
    assert [s.step for s in planner.steps] == [1]  # the first step: the refused array changed nothing
    assert np.asarray(planner.steps[0].action, np.float32).tobytes() == ref.step(obs[1]).action.tobytes()
