"""The flashrt lifecycle node: parameters -> Session; one policy step per observation; capsule
services and the Replan action; /diagnostics.

    on_configure  allocate, load weights, warm up, capture (Session)
    on_activate   subscribe 'observation', serve services + 'replan', start diagnostics
    on_deactivate stop all of that; on_cleanup  release the Session

Run: ``ros2 run flashrt_ros flashrt_node --ros-args --params-file config/flashrt.yaml``
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, Header

from flashrt_interfaces.msg import PolicyStep

from ..runtime.errors import CapsuleError
from ..runtime.session import Session
from .convert import message_to_obs, stamp_to_ns
from .diagnostics import diagnostics_message
from .params import declare_all, guard_read_only, read_config
from .replan_server import HELD_MAX, ReplanServer
from .services import CapsuleServices

NODE_NAME = "flashrt"
LATENCY_WINDOW = 1000  # steps kept for the p50 / p99 in /diagnostics


@dataclass
class NodeStats:
    steps: int = 0
    rejected: int = 0
    held: int = 0
    step_deadline_misses: int = 0
    capsule_errors: int = 0
    replans: int = 0
    replans_rejected: int = 0
    replan_deadline_misses: int = 0
    latencies_ms: list = field(default_factory=list)

    def add_latency(self, ms: float) -> None:
        self.latencies_ms.append(ms)
        if len(self.latencies_ms) > 2 * LATENCY_WINDOW:
            del self.latencies_ms[:-LATENCY_WINDOW]


class FlashRTNode(LifecycleNode):
    def __init__(self, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        declare_all(self)
        guard_read_only(self, lambda: self.session is not None)
        self.session: Session | None = None
        self.stats = NodeStats()
        self.last_stamp_ns = 0
        self._own: dict = {}
        self._topic_pubs: dict = {}
        self._observation_sub = self._capsule_services = self._replan_server = self._diagnostics_timer = None

    # ---- lifecycle ------------------------------------------------------------------------
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        try:
            cfg, self._own = read_config(self)
            t0 = time.perf_counter()
            self.session = Session(cfg, self._own["backend"])
        except Exception as e:  # noqa: BLE001 - any configuration error fails the transition, clearly
            self.get_logger().error(f"configure failed: {e}")
            self.session = None
            return TransitionCallbackReturn.FAILURE
        s = self.session
        self.get_logger().info(
            f"configured in {(time.perf_counter() - t0) * 1e3:.0f} ms: backend {s.backend.name}, "
            f"{len(s.plan.ops)} ops, state {s.arena.row_nbytes / 2**20:.2f} MiB per capsule, "
            f"{s.store.capacity} capsule slots, fingerprint {s.fingerprint[:12]}")
        self._topic_pubs = {
            "action": self.create_publisher(Float64MultiArray, "action", 10),
            "policy_step": self.create_publisher(PolicyStep, "policy_step", 10),
            "diagnostics": self.create_publisher(DiagnosticArray, "/diagnostics", 10),
        }
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        msg_type = JointState if self._own["observation_type"] == "joint_state" else Float32MultiArray
        # [replan] depth HELD_MAX: an executor stalled for a few sensor periods (a loaded CPU) still steps
        # every observation, in order, as a replan does with the ones it holds
        if self._own["observation_reliable"]:
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=HELD_MAX, reliability=ReliabilityPolicy.RELIABLE)
        else:
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=HELD_MAX,
                             reliability=qos_profile_sensor_data.reliability)
        self._observation_sub = self.create_subscription(msg_type, "observation", self.on_observation, qos)
        self._capsule_services = CapsuleServices(self)
        self._replan_server = ReplanServer(self)
        self._diagnostics_timer = self.create_timer(self._own["diagnostics_period_s"], self.publish_diagnostics)
        self.get_logger().info(f"active: stepping on '{self._observation_sub.topic_name}' ({msg_type.__name__})")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        if self._observation_sub is not None:
            self.destroy_subscription(self._observation_sub)
        if self._capsule_services is not None:
            self._capsule_services.destroy()
        if self._replan_server is not None:
            self._replan_server.destroy()
        if self._diagnostics_timer is not None:
            self.destroy_timer(self._diagnostics_timer)
        self._observation_sub = self._capsule_services = self._replan_server = self._diagnostics_timer = None
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        for pub in self._topic_pubs.values():
            self.destroy_publisher(pub)
        self._topic_pubs = {}
        self.session = None
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        if self._observation_sub is not None:
            self.on_deactivate(state)
        return self.on_cleanup(state)

    # ---- stepping -------------------------------------------------------------------------
    def on_observation(self, msg) -> None:
        # [replan] while a replan runs, the latest observation is held and the replan thread steps it
        # between two batched steps (ReplanServer.hold / LiveGate)
        if self._replan_server is not None and self._replan_server.hold(msg):
            return
        self.step_from_message(msg)

    def step_from_message(self, msg) -> None:
        session = self.session
        try:
            obs = message_to_obs(msg, self._own["observation_type"], session.cfg.obs_dim, self._own["joint_names"])
        except ValueError as e:
            self.stats.rejected += 1
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        header = getattr(msg, "header", None)
        stamp = header.stamp if header is not None else self.get_clock().now().to_msg()
        self.last_stamp_ns = stamp_to_ns(stamp)

        def publish_action(action: np.ndarray) -> None:
            self._topic_pubs["action"].publish(Float64MultiArray(data=action.astype(np.float64).tolist()))

        try:
            res = session.step(obs, self.last_stamp_ns, on_action=publish_action)
        except CapsuleError as e:  # the step ran and the action went out; only the capsule is missing
            self.stats.capsule_errors += 1
            self.get_logger().error(f"no capsule for this step: {e}", throttle_duration_sec=1.0)
            return
        self.stats.steps += 1
        self.stats.add_latency(res.latency_ms)
        if res.latency_ms > self.get_parameter("step_deadline_ms").value:
            self.stats.step_deadline_misses += 1
            self.get_logger().warning(f"step took {res.latency_ms:.2f} ms", throttle_duration_sec=1.0)
        self._topic_pubs["policy_step"].publish(PolicyStep(
            header=Header(stamp=stamp, frame_id=header.frame_id if header is not None else ""),
            step=res.step, capsule_id=res.capsule_id, action=res.action.tolist(),
            action_chunk=res.chunk.ravel().tolist(), chunk_len=session.cfg.chunk_len,
            step_latency_ms=res.latency_ms))

    def publish_diagnostics(self) -> None:
        msg = diagnostics_message(self, self.stats, self.session, self.get_parameter("step_deadline_ms").value)
        msg.header.stamp = self.get_clock().now().to_msg()
        self._topic_pubs["diagnostics"].publish(msg)


def main(args=None) -> int:
    rclpy.init(args=args)
    node = FlashRTNode()
    # SingleThreaded, not EventsExecutor: rclpy 9.1's EventsExecutor hung at 100% CPU serving an action
    # goal here (even a plain synchronous one); see README. Humble has no EventsExecutor anyway.
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    code = 0
    try:
        if node.get_parameter("autostart").value:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                code = 1
            elif node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                code = 1
        if code == 0:
            executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node._observation_sub is not None:  # stop the replan worker before the executor goes
            node.on_deactivate(None)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
