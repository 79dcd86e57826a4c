"""Output a controller can take: 'action' with its layout (forward_command_controller) and
'action_trajectory' (joint_trajectory_controller), stamped with the observation's stamp; a zero stamp is
replaced by the node's clock and counted on /diagnostics."""
import time

import numpy as np
import pytest
from ros_harness import Diagnostics, joint_state
from test_ros_float_array import float_node  # noqa: F401 - the fixture

from conftest import observation_trace
from flashrt_ros.ros.io.convert import stamp_to_ns
from flashrt_ros.ros.io.outputs import trajectory_points

pytestmark = pytest.mark.ros

JOINTS = [f"arm_joint_{i + 1}" for i in range(7)]
PERIOD_S = 0.02
CHUNK_LEN = 8  # config/flashrt.yaml


@pytest.fixture
def node_params():
    return {"publish_trajectory": True, "action_joint_names": JOINTS, "control_period_s": PERIOD_S}


class Outputs:
    """The controller's side: every action and trajectory the node sends."""

    def __init__(self, planner, units=(1.0, 0.0)):
        """``units``: the node's (action_scale, action_offset), which the trajectory's positions carry."""
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory
        self.planner, self.actions, self.trajectories, self.units = planner, [], [], units
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        ns = planner.namespace
        planner.node.create_subscription(Float64MultiArray, f"{ns}/action", self.actions.append, qos)
        planner.node.create_subscription(JointTrajectory, f"{ns}/action_trajectory", self.trajectories.append, qos)

    def wait(self, n: int, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        while (len(self.actions) < n or len(self.trajectories) < n) and time.monotonic() < end:
            self.planner.spin(0.01)
        return len(self.actions) >= n and len(self.trajectories) >= n

    def linked(self, obs) -> None:
        """Step until both outputs arrive (a volatile writer may miss a reader it has not matched yet)."""
        for o in obs:
            self.planner.step(o)
            if self.wait(1, timeout=2.0):
                break
        assert self.actions and self.trajectories, "no action / action_trajectory arrived"
        # whatever else is in flight, up to the last step's outputs (a fixed wait lets a late one in after clear())
        last = np.asarray(self.planner.steps[-1].action, np.float32).astype(np.float64).tobytes()
        chunk = np.asarray(self.planner.steps[-1].action_chunk, np.float32).reshape(-1, len(last) // 8)
        first = trajectory_points(chunk[:1], *self.units, 1.0)[0][0].tobytes()  # point 0's positions
        self.planner.spin_until(lambda: np.asarray(self.trajectories[-1].points[0].positions).tobytes() == first
                                and np.asarray(self.actions[-1].data).tobytes() == last)
        self.actions.clear()
        self.trajectories.clear()


def test_action_and_trajectory_carry_names_sizes_order_stamps_and_times(flashrt):
    _, planner = flashrt
    out = Outputs(planner)
    obs = observation_trace(40)
    out.linked(obs[:20])
    steps = []
    for i, o in enumerate(obs[20:25]):
        steps.append(planner.step(o))
        assert out.wait(i + 1), "an output of the step is missing"
    assert len(out.actions) == len(out.trajectories) == 5
    for step, action, traj in zip(steps, out.actions, out.trajectories):
        dim, fence = action.layout.dim  # the joints, and the leader's epoch (issue 44.2)
        assert (dim.label, dim.size, dim.stride, action.layout.data_offset) == ("joints", 7, 7, 0)
        assert (fence.label, fence.size, fence.stride, step.epoch) == ("flashrt_epoch=1", 1, 1, 1)
        assert np.asarray(action.data).tobytes() == np.asarray(step.action, np.float32).astype(np.float64).tobytes()
        assert list(traj.joint_names) == JOINTS
        # stamp zero: the controller starts it on arrival (the observation's stamp is past by then); issue 44.5
        assert stamp_to_ns(traj.header.stamp) == 0 and traj.header.frame_id == "flashrt_epoch=1"
        assert stamp_to_ns(step.header.stamp) != 0  # policy_step keeps the observation's stamp
        assert len(traj.points) == CHUNK_LEN
        chunk = np.asarray(step.action_chunk, np.float32).astype(np.float64).reshape(CHUNK_LEN, 7)
        for k, point in enumerate(traj.points):
            assert np.asarray(point.positions).tobytes() == chunk[k].tobytes()  # action_scale 1, offset 0
            assert stamp_to_ns(point.time_from_start) == round((k + 1) * PERIOD_S * 1e9)
        # velocities: central differences of the positions over control_period_s, one-sided first, zero last
        vel = np.array([p.velocities for p in traj.points])
        assert vel.tobytes() == np.vstack([np.gradient(chunk, PERIOD_S, axis=0)[:-1], np.zeros((1, 7))]).tobytes()
        assert not vel[-1].any() and vel[1].tobytes() == ((chunk[2] - chunk[0]) / (2 * PERIOD_S)).tobytes()


def test_a_zero_stamp_is_replaced_by_the_node_clock_and_counted(flashrt):
    _, planner = flashrt
    diag = Diagnostics(planner)
    out = Outputs(planner)
    obs = observation_trace(30)
    out.linked(obs[:20])
    n = len(planner.steps)
    before = time.time_ns()
    planner.publish(joint_state(obs[20], 0))  # a driver that never sets header.stamp
    end = time.monotonic() + 10
    while len(planner.steps) == n and time.monotonic() < end:
        planner.spin(0.01)
    step = planner.steps[-1]
    assert out.wait(1)
    assert stamp_to_ns(step.header.stamp) >= before  # the node's clock (system time), not 0
    diag.until(lambda v: v["stamps_from_node_clock"] == "1")
    stamped = planner.step(obs[21])  # a stamped one is not counted
    diag.until(lambda v: v["steps"] == str(stamped.step) and v["stamps_from_node_clock"] == "1")


def test_a_stamp_far_in_the_future_is_refused_counted_and_leaves_the_state_as_it_was(flashrt):
    """Issue 44.5: an observation stamped 10 years ahead was stepped, and its trajectory carried that stamp (a
    controller would wait until then). Refused past max_future_stamp_ms (default 500 ms), counted, and the
    next step is byte for byte the step a session that never saw it takes."""
    from ros_harness import reference_session
    _, planner = flashrt
    diag = Diagnostics(planner)
    ref = reference_session()
    obs = observation_trace(4)
    first = planner.step(obs[0])
    assert np.asarray(first.action, np.float32).tobytes() == ref.step(obs[0]).action.tobytes()
    ten_years = 10 * 365 * 86_400 * 10**9
    planner.publish(joint_state(obs[1], time.time_ns() + ten_years))
    planner.publish(joint_state(obs[1], time.time_ns() + 2 * 10**9))  # 2 s ahead: past the default too
    status, values = diag.until(lambda v: v["stamps_in_future"] == "2")
    assert values["rejected_inputs"] == "2" and values["steps"] == "1"  # nothing stepped
    nxt = planner.step(obs[2])  # now-ish (Planner.step's stamps are behind the clock)
    assert nxt.step == first.step + 1
    want = ref.step(obs[2])
    assert np.asarray(nxt.action, np.float32).tobytes() == want.action.tobytes()
    assert np.asarray(nxt.action_chunk, np.float32).tobytes() == want.chunk.tobytes()


def test_a_stamp_before_1970_is_refused_and_counted_and_the_next_observation_steps_on(flashrt):
    _, planner = flashrt
    diag = Diagnostics(planner)
    obs = observation_trace(30)
    first = planner.step(obs[0])
    planner.publish(joint_state(obs[1], -5 * 10**9))  # sec = -5: no capsule file or record could carry it
    diag.until(lambda v: v["rejected_inputs"] == "1")
    assert planner.steps[-1].step == first.step  # nothing was stepped
    nxt = planner.step(obs[1])
    assert nxt.step == first.step + 1


def test_action_joint_names_default_to_generated_names_and_must_fit_action_dim():
    from flashrt_ros.ros.io.outputs import action_joint_names
    assert action_joint_names([], 3) == ["action_0", "action_1", "action_2"]
    assert action_joint_names(["a", "b"], 2) == ["a", "b"]
    with pytest.raises(ValueError, match="action_joint_names: 2 names for action_dim 7"):
        action_joint_names(["a", "b"], 7)


BAD_JOINT_NAMES = ["a/b", "x y", " ", "\u00e9", "..", "", "1st", "arm.joint", "arm-joint", "joint\n"]


@pytest.mark.parametrize("bad", BAD_JOINT_NAMES)
def test_action_joint_names_a_controller_would_refuse_are_refused_naming_the_bad_one(bad):
    """Issue 44.5: 'a/b', 'x y', ' ', 'é' and '..' were accepted and sent in JointTrajectory (ros2_control names
    a joint's interfaces '<joint>/<interface>'); refused when the parameter is set, and at configure for the
    names a policy file brings (outputs.action_joint_names)."""
    from flashrt_ros.ros.io.outputs import action_joint_names
    from flashrt_ros.ros.params import check_node_param
    names = ["shoulder_pan_joint", bad, "_wrist2"]
    with pytest.raises(ValueError, match=r"action_joint_names: .* \(index 1\) is not a joint name a controller "
                                         r"takes") as e:
        check_node_param("action_joint_names", names) if bad else action_joint_names(names, 3)
    assert repr(bad) in str(e.value)
    with pytest.raises(ValueError, match=r"\(index 1\) is not a joint name"):
        action_joint_names(names, 3)
    good = ["shoulder_pan_joint", "Joint_2", "_wrist2"]
    assert check_node_param("action_joint_names", good) == action_joint_names(good, 3) == good
    assert check_node_param("joint_names", names if bad else good)  # a robot's own names are matched, not sent


def test_trajectory_points_are_the_chunk_in_the_robots_units_with_finite_difference_velocities():
    """Positions get action_scale / action_offset as 'action' does (the chunk head's tanh alone never leaves
    (-1, 1)); velocities are central differences over control_period_s, one-sided at point 0, zero last."""
    from flashrt_ros.ros.io.outputs import trajectory_points
    chunk = np.array([[0.0, 0.5], [0.25, 0.5], [0.75, -0.5], [1.0, -1.0]], np.float32)
    pos, vel = trajectory_points(chunk, np.array([2.0, 4.0], np.float32), np.array([1.0, -1.0], np.float32), 0.5)
    assert pos.tolist() == [[1.0, 1.0], [1.5, 1.0], [2.5, -3.0], [3.0, -5.0]]
    assert vel.tolist() == [[1.0, 0.0], [1.5, -4.0], [1.5, -6.0], [0.0, 0.0]]
    assert trajectory_points(chunk[:1], 1.0, 0.0, 0.5)[1].tolist() == [[0.0, 0.0]]


def test_a_float_array_observation_is_stamped_with_the_node_clock_and_counted(float_node):  # noqa: F811
    from std_msgs.msg import Float32MultiArray
    planner = float_node
    diag = Diagnostics(planner)
    before = time.time_ns()
    planner.pub.publish(Float32MultiArray(data=observation_trace(1)[0].tolist()))
    end = time.monotonic() + 10
    while not planner.steps and time.monotonic() < end:
        planner.spin(0.01)
    (step,) = planner.steps
    assert stamp_to_ns(step.header.stamp) >= before  # an array has no header: the node's clock
    diag.until(lambda v: v["steps"] == "1" and v["stamps_from_node_clock"] == "1")
