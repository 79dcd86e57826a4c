"""flashrt-sim as a ROS 2 node: the MuJoCo arm at 100 Hz, the source of sim time.

Each control period (a steady wall-clock timer, real time) it applies the newest joint targets, steps the world
10 ms, then publishes, all stamped with the world's time:
  /clock                 rosgraph_msgs/Clock                 so nodes with use_sim_time follow the simulation
  joint_states           sensor_msgs/JointState              the arm's positions and velocities
  observation            std_msgs/Float32MultiArray          the policy's observation (OBS_NAMES, obs_dim 21):
                                                             flashrt with observation_type float32_array
It takes joint targets from action_trajectory (trajectory_msgs/JointTrajectory, the first point; joints by name
when they are the arm's, else in order) and from action (std_msgs/Float64MultiArray, the policy node's action).
With expert:=true the scripted expert drives the arm instead, and its targets go out on expert_command.
With faults:=true `observation` carries the episode's seeded sensor faults (sim/faults.py) and their true readings
go out late on observation_corrected (sim/fault_feed.py); joint_states stays true. With policy_reset_service set
(the policy node's `reset`), each new episode waits, sim time paused, until that service has reset the policy.
With wait_for_subscribers N > 0, sim time starts once N readers subscribe to observation (none misses reading 1).
Every step's world state is kept as a world capsule under its sim time (world_capsule_capacity of them); the
restore_world service (flashrt_interfaces/RestoreWorld) puts the physics back to one, beside a policy rollback.
"""
from __future__ import annotations

import signal
import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_interfaces.srv import RestoreWorld

from ..ros.io.convert import stamp_to_ns
from ..tools.common import init_rclpy
from .capsules import WorldCapsules
from .expert import PusherExpert
from .fault_feed import CORRECTION_TOPIC, FaultFeed
from .world import ARM_JOINTS, CONTROL_HZ, PusherWorld

NODE_NAME = "flashrt_sim"
ENDLESS_EPISODE_STEPS = 360_000  # faults are drawn per episode: without episode_s, an hour's worth
POLICY_RESET_TIMEOUT_S = 5.0


def _stamp(ns: int):
    from builtin_interfaces.msg import Time
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def targets_from_trajectory(msg: JointTrajectory) -> np.ndarray:
    """The first point's positions in ARM_JOINTS order; ValueError for a trajectory the arm cannot take."""
    if not msg.points:
        raise ValueError("a JointTrajectory without points")
    pos = np.asarray(msg.points[0].positions, np.float64)
    names = list(msg.joint_names)
    if pos.shape != (len(ARM_JOINTS),) or len(names) not in (0, len(ARM_JOINTS)):
        raise ValueError(f"{len(pos)} positions for {len(names)} joints; the arm has {len(ARM_JOINTS)}")
    if set(names) == set(ARM_JOINTS):
        pos = pos[[names.index(j) for j in ARM_JOINTS]]
    return pos


class SimNode(Node):
    def __init__(self):
        super().__init__(NODE_NAME)
        self.declare_parameter("seed", 0)
        self.declare_parameter("expert", False)
        self.declare_parameter("episode_s", 0.0)  # > 0: a new episode (seed + 1) after this much sim time
        self.declare_parameter("world_capsule_capacity", 6000)  # a minute at 100 Hz, about 2.5 MB
        self.declare_parameter("faults", False)
        self.declare_parameter("policy_reset_service", "")
        self.declare_parameter("wait_for_subscribers", 0)  # > 0: the first step waits for this many on observation
        self.world = PusherWorld()
        self.seed = int(self.get_parameter("seed").value)
        self.obs = self.world.reset(self.seed)
        self.targets = self.world.joint_positions()
        self.expert = PusherExpert(self.world) if self.get_parameter("expert").value else None
        self.episode_steps = int(round(float(self.get_parameter("episode_s").value) * CONTROL_HZ))
        self.steps = 0
        self.capsules = WorldCapsules(int(self.get_parameter("world_capsule_capacity").value))
        self.capsules.take(self.world)
        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.clock_pub = self.create_publisher(ClockMsg, "/clock", reliable)
        self.joint_pub = self.create_publisher(JointState, "joint_states", reliable)
        self.obs_pub = self.create_publisher(Float32MultiArray, "observation", reliable)
        self.expert_pub = self.create_publisher(JointTrajectory, "expert_command", reliable) if self.expert else None
        self.feed = FaultFeed() if self.get_parameter("faults").value else None
        if self.feed is not None:
            self.feed.start(self.seed, self.episode_steps or ENDLESS_EPISODE_STEPS)
            self.correction_pub = self.create_publisher(Float64MultiArray, CORRECTION_TOPIC, reliable)
        reset_service = str(self.get_parameter("policy_reset_service").value)
        self.reset_client = self.create_client(Trigger, reset_service) if reset_service else None
        self._policy_reset = None  # (future, wall deadline) while a new episode waits for the policy's reset
        self.create_subscription(JointTrajectory, "action_trajectory", self.on_trajectory, reliable)
        self.create_subscription(Float64MultiArray, "action", self.on_action, reliable)
        self.create_service(RestoreWorld, "restore_world", self.on_restore_world)
        # a steady wall-clock timer: the node's own clock may be sim time, which only this node advances
        self.timer = self.create_timer(1.0 / CONTROL_HZ, self.tick, clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.waiting_for = int(self.get_parameter("wait_for_subscribers").value)
        if not self.waiting_for:
            self.publish()

    def on_trajectory(self, msg: JointTrajectory) -> None:
        try:
            self.targets = targets_from_trajectory(msg)
        except ValueError as e:
            self.get_logger().warning(f"action_trajectory refused: {e}", throttle_duration_sec=5.0)

    def on_action(self, msg: Float64MultiArray) -> None:
        a = np.asarray(msg.data, np.float64)
        if a.shape != (len(ARM_JOINTS),) or not np.isfinite(a).all():
            self.get_logger().warning(f"action refused: {a.size} values, the arm has {len(ARM_JOINTS)}",
                                      throttle_duration_sec=5.0)
            return
        self.targets = a

    def tick(self) -> None:
        if self.waiting_for:
            if self.obs_pub.get_subscription_count() < self.waiting_for:
                return  # sim time has not started: the first reading goes to every reader expected
            self.waiting_for = 0
            self.publish()
            return
        if self._policy_reset is not None:
            future, deadline = self._policy_reset
            if not future.done() and time.monotonic() < deadline:
                return  # sim time paused: the new episode starts once the policy has forgotten the last one
            if not future.done():
                self.get_logger().warning("the policy's reset did not answer: the episode starts without it")
            self._policy_reset = None
            self.publish()
            return
        if self.expert is not None:
            self.targets = self.expert(self.obs)
            self.publish_expert(self.world.time_ns, self.targets)
        try:
            self.obs = self.world.step(self.targets)
        except ValueError as e:
            self.get_logger().warning(f"targets refused: {e}", throttle_duration_sec=5.0)
            self.targets = self.world.joint_positions()
            return
        self.steps += 1
        if self.episode_steps and self.steps % self.episode_steps == 0:
            self.seed += 1
            time_ns = self.world.time_ns
            self.obs = self.world.reset(self.seed)
            self.world.data.time = time_ns / 1e9  # sim time never goes back: /clock is monotonic across episodes
            self.targets = self.world.joint_positions()
            if self.feed is not None:
                self.feed.start(self.seed, self.episode_steps)
            if self.reset_client is not None:
                self.capsules.take(self.world)
                self._policy_reset = (self.reset_client.call_async(Trigger.Request()),
                                      time.monotonic() + POLICY_RESET_TIMEOUT_S)
                return
        self.capsules.take(self.world)
        self.publish()

    def on_restore_world(self, request, response):
        now_ns = self.world.time_ns
        try:
            stamp, state = self.capsules.at(stamp_to_ns(request.stamp))
        except KeyError as e:
            response.success, response.message = False, str(e.args[0])
            return response
        self.world.set_state(state)
        self.world.data.time = now_ns / 1e9  # sim time runs on: /clock never goes back
        self.obs, self.targets = self.world.observation(), self.world.targets.copy()
        response.success, response.restored = True, _stamp(stamp)
        return response

    def publish(self) -> None:
        ns = self.world.time_ns
        stamp = _stamp(ns)
        self.clock_pub.publish(ClockMsg(clock=stamp))
        js = JointState(name=list(ARM_JOINTS), position=self.world.joint_positions().tolist(),
                        velocity=self.world.joint_velocities().tolist())
        js.header.stamp = stamp
        self.joint_pub.publish(js)
        reading = np.asarray(self.obs, np.float32)
        if self.feed is not None:
            reading, correction = self.feed.read(ns, self.obs)
            if correction is not None:
                self.correction_pub.publish(correction)
        self.obs_pub.publish(Float32MultiArray(data=reading.tolist()))

    def publish_expert(self, ns: int, targets: np.ndarray) -> None:
        msg = JointTrajectory(joint_names=list(ARM_JOINTS),
                              points=[JointTrajectoryPoint(positions=targets.tolist())])
        msg.header.stamp = _stamp(ns)
        self.expert_pub.publish(msg)


def main(args=None) -> int:
    # SIGINT / SIGTERM only stop the loop: rclpy's own handler shut the context down under a tick that was
    # publishing, and the node died with "publisher's context is invalid" (exit 1)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    init_rclpy(args)
    node = SimNode()
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.05)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
