"""flashrt-sim as a real ROS process: /clock, joint_states and the observation at 100 Hz of sim time, a
JointTrajectory on action_trajectory moves the arm to its targets, and restore_world puts it back."""
import subprocess
import sys
import time

import numpy as np
import pytest
from ros_harness import ROOT, terminate_all

from flashrt_ros.sim.world import ARM_JOINTS, OBS_DIM

pytestmark = pytest.mark.ros


@pytest.fixture
def sim(ros_domain, tmp_path):
    log = open(tmp_path / "sim.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.sim.cli", "--seed", "3", "--ros-args", "-r",
                             "__ns:=/arm"], env=ros_domain, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        terminate_all([proc])
        log.close()
    assert proc.returncode in (0, -15), (tmp_path / "sim.log").read_text()


class Listener:
    def __init__(self):
        import rclpy
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float32MultiArray
        from trajectory_msgs.msg import JointTrajectory
        self.rclpy = rclpy
        self.node = rclpy.create_node("sim_listener")
        qos = QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)
        self.clock, self.joints, self.obs = [], [], []
        self.node.create_subscription(Clock, "/clock", self.clock.append, qos)
        self.node.create_subscription(JointState, "/arm/joint_states", self.joints.append, qos)
        self.node.create_subscription(Float32MultiArray, "/arm/observation", self.obs.append, qos)
        self.command = self.node.create_publisher(JointTrajectory, "/arm/action_trajectory", qos)

    def spin_until(self, done, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while not done() and time.monotonic() < end:
            self.rclpy.spin_once(self.node, timeout_sec=0.05)
        assert done(), f"{len(self.clock)} clocks, {len(self.joints)} joint states, {len(self.obs)} observations"


def _ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def test_the_sim_publishes_clock_joint_states_and_observations_every_10_ms_of_sim_time(sim):
    ear = Listener()
    ear.spin_until(lambda: len(ear.clock) >= 50 and len(ear.joints) >= 50 and len(ear.obs) >= 50)
    clock = np.array([_ns(c.clock) for c in ear.clock])
    assert set(np.diff(clock).tolist()) == {10_000_000}
    stamps = np.array([_ns(j.header.stamp) for j in ear.joints])
    assert set(np.diff(stamps).tolist()) == {10_000_000}
    assert list(ear.joints[0].name) == list(ARM_JOINTS)
    assert all(len(o.data) == OBS_DIM for o in ear.obs)


def test_a_joint_trajectory_moves_the_arm_to_its_first_points_targets(sim):
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint
    ear = Listener()
    ear.spin_until(lambda: len(ear.joints) >= 5)
    start = np.array(ear.joints[-1].position)
    targets = start.copy()
    targets[[0, 1, 3]] += [0.4, 0.3, -0.5]
    order = list(reversed(ARM_JOINTS))  # by name, not by position in the message
    ear.command.publish(JointTrajectory(joint_names=order, points=[JointTrajectoryPoint(
        positions=[float(targets[ARM_JOINTS.index(j)]) for j in order])]))
    ear.spin_until(lambda: np.abs(np.array(ear.joints[-1].position) - targets).max() < 0.05)
    assert np.abs(np.array(ear.joints[-1].position) - start).max() > 0.3


def test_restore_world_puts_the_arm_back_where_it_was_at_that_sim_time_while_the_clock_runs_on(sim):
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    from flashrt_interfaces.srv import RestoreWorld
    ear = Listener()
    ear.spin_until(lambda: len(ear.joints) >= 5)
    before = ear.joints[-1]
    targets = np.array(before.position) + np.array([0.5, 0.3, 0.0, -0.5, 0.0, 0.0, 0.0])
    ear.command.publish(JointTrajectory(joint_names=list(ARM_JOINTS),
                                        points=[JointTrajectoryPoint(positions=targets.tolist())]))
    ear.spin_until(lambda: np.abs(np.array(ear.joints[-1].position) - before.position).max() > 0.3)
    client = ear.node.create_client(RestoreWorld, "/arm/restore_world")
    assert client.wait_for_service(timeout_sec=10)
    future = client.call_async(RestoreWorld.Request(stamp=before.header.stamp))
    ear.spin_until(future.done)
    reply = future.result()
    assert reply.success, reply.message
    assert _ns(reply.restored) == _ns(before.header.stamp)
    restored_at = len(ear.joints)
    ear.spin_until(lambda: len(ear.joints) > restored_at + 1)
    after = ear.joints[restored_at + 1]  # a step past the restore: the old targets hold the arm where it was
    assert np.abs(np.array(after.position) - before.position).max() < 0.01
    assert _ns(after.header.stamp) > _ns(ear.joints[restored_at - 1].header.stamp)  # sim time never went back
