"""The flashrt lifecycle node: parameters -> Session; one policy step per observation; capsule
services and the Replan action; /diagnostics.

    on_configure  validate parameters, allocate, load weights, warm up, capture (Session)
    on_activate   subscribe 'observation', serve services + 'replan', enable the publishers
    on_deactivate stop all of that; on_cleanup  release the Session
    /diagnostics  published in every state, with the lifecycle state

With ``autostart`` (the default) the node configures and activates itself; without it, a lifecycle
manager or ``ros2 lifecycle set <node> configure`` then ``... activate`` brings it up.

Run: ``ros2 run flashrt_ros flashrt_node --ros-args --params-file config/flashrt.yaml``
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, Header

from flashrt_interfaces.msg import PolicyStep

from ..runtime.errors import CapsuleError, FingerprintMismatch
from ..runtime.persist import PersistSettings
from ..runtime.persist_format import LogCorrupt
from ..runtime.persistence import move_aside
from ..runtime.session import Session
from .capsule_dir import CapsuleDir
from .convert import ObservationReader, stamp_to_ns
from .diagnostics import device_name, diagnostics_message
from .params import check_node_param, command_line_overrides, declare_all, guard_live_params, read_config
from .replan_server import HELD_MAX, ReplanServer
from .services import CapsuleServices
from .step_link import policy_step_qos

NODE_NAME = "flashrt"
LATENCY_WINDOW = 1000  # steps kept for the p50 / p99 in /diagnostics
RATE_WINDOW = 200  # steps over which /diagnostics measures the step rate
RUNTIME_LOGGER = "flashrt_ros"  # Python logging of the runtime, forwarded to the ROS log


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
    persist_drops_reported: int = 0  # persist drops seen by the last /diagnostics
    latencies_ms: list = field(default_factory=list)
    step_times: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    def add_latency(self, ms: float) -> None:
        self.latencies_ms.append(ms)
        self.step_times.append(time.monotonic())
        if len(self.latencies_ms) > 2 * LATENCY_WINDOW:
            del self.latencies_ms[:-LATENCY_WINDOW]


class RosLogHandler(logging.Handler):
    """Python `logging` records (the runtime's) -> the node's ROS logger, at the matching severity."""

    def __init__(self, ros_logger):
        super().__init__(logging.INFO)
        self.ros_logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"[{record.name}] {record.getMessage()}"
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            elif record.levelno >= logging.WARNING:
                self.ros_logger.warning(text)
            elif record.levelno >= logging.INFO:
                self.ros_logger.info(text)
            else:
                self.ros_logger.debug(text)
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)


class FlashRTNode(LifecycleNode):
    def __init__(self, argv=None, **kwargs):
        """``argv``: the process's ROS arguments, to recover ``-p`` values rclpy would drop (params.py)."""
        super().__init__(NODE_NAME, **kwargs)
        declare_all(self, command_line_overrides(argv, self.get_name()))
        guard_live_params(self)
        self._log_handler = RosLogHandler(self.get_logger())
        runtime_log = logging.getLogger(RUNTIME_LOGGER)
        runtime_log.addHandler(self._log_handler)
        runtime_log.setLevel(logging.INFO)
        self.session: Session | None = None
        self.resume_summary = ""  # what on_configure resumed from persist_dir
        self.stats = NodeStats()
        self.last_stamp_ns = 0
        self.hardware_id = "unconfigured"
        self._own: dict = {}
        self._reader: ObservationReader | None = None
        self._capsule_dir: CapsuleDir | None = None
        self._topic_pubs: dict = {}
        self._observation_sub = self._capsule_services = self._replan_server = None
        self._last_usage = None
        # /diagnostics is a plain publisher on a timer made here: it reports every lifecycle state,
        # so a supervisor sees an inactive node as inactive instead of as stale.
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        try:
            period = check_node_param("diagnostics_period_s", self.get_parameter("diagnostics_period_s").value)
        except ValueError:
            period = 1.0  # configure fails and names the parameter
        self._diagnostics_timer = self.create_timer(period, self.publish_diagnostics)

    def lifecycle_state(self) -> str:
        try:
            return str(self._state_machine.current_state[1])
        except Exception:  # noqa: BLE001 - private rclpy API: degrade to a label, never fail
            return "unknown"

    # ---- lifecycle ------------------------------------------------------------------------
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        try:
            cfg, own = read_config(self)
            capsule_dir = CapsuleDir(own["capsule_dir"])
            capsule_dir.refuse_overlap(own["persist_dir"])
            reader = ObservationReader(own["observation_type"], cfg.obs_dim, own["joint_names"])
            t0 = time.perf_counter()
            session = Session(cfg, own["backend"])
            self.resume_summary = self._start_persistence(session, own)
        except Exception as e:  # noqa: BLE001 - any configuration error fails the transition, clearly
            self.get_logger().error(f"configure failed: {' '.join(str(e).split())}")
            return TransitionCallbackReturn.FAILURE
        self.session, self._own, self._capsule_dir, self._reader = session, own, capsule_dir, reader
        self.hardware_id = device_name(session.backend)
        usage = session.store_usage()
        self.get_logger().info(
            f"configured in {(time.perf_counter() - t0) * 1e3:.0f} ms: backend {session.backend.name} on "
            f"{self.hardware_id}, {len(session.plan.ops)} ops, {usage.capacity} capsule slots, "
            f"fingerprint {session.fingerprint[:12]}, capsule_dir {capsule_dir.root}")
        # Lifecycle publishers: nothing goes out on them unless the node is active.
        self._topic_pubs = {
            "action": self.create_lifecycle_publisher(Float64MultiArray, "action", 10),
            "policy_step": self.create_lifecycle_publisher(PolicyStep, "policy_step", policy_step_qos()),
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
        super().on_activate(state)  # enables the lifecycle publishers
        self._observation_sub = self.create_subscription(msg_type, "observation", self.on_observation, qos)
        self._capsule_services = CapsuleServices(self, self._capsule_dir)
        self._replan_server = ReplanServer(self)
        self.get_logger().info(f"active: stepping on '{self._observation_sub.topic_name}' ({msg_type.__name__})")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: State | None) -> TransitionCallbackReturn:
        # The replan worker first: it may still publish feedback, which needs a live node and context.
        if self._replan_server is not None:
            self._replan_server.destroy()
        if self._observation_sub is not None:
            self.destroy_subscription(self._observation_sub)
        if self._capsule_services is not None:
            self._capsule_services.destroy()
        self._observation_sub = self._capsule_services = self._replan_server = None
        super().on_deactivate(state)  # disables the lifecycle publishers
        return TransitionCallbackReturn.SUCCESS

    def _start_persistence(self, session: Session, own: dict) -> str:
        """The capsule log in persist_dir, resumed when asked. Returns what was resumed ("" = nothing);
        raises ValueError naming the parameter when it cannot start."""
        if not own["persist_dir"]:
            if own["resume"]:
                raise ValueError("resume: true needs persist_dir (the directory of the capsule log)")
            return ""
        directory = Path(own["persist_dir"]).expanduser()
        settings = PersistSettings(directory, own["persist_fsync_records"], own["persist_fsync_ms"],
                                   own["persist_segment_mb"], own["persist_budget_mb"], own["persist_queue_mb"])
        try:
            report = session.enable_persistence(settings, resume=own["resume"])
        except FingerprintMismatch as e:
            if not own["resume_fresh_on_mismatch"]:
                raise ValueError(f"{e}. Point persist_dir elsewhere, or set resume_fresh_on_mismatch:=true to move "
                                 "that log aside and start fresh") from None
            moved = move_aside(directory)
            self.get_logger().warning(f"persist_dir {directory}: the log was written by another config, weights or "
                                      f"plan; moved to {moved}, starting fresh")
            report = session.enable_persistence(settings, resume=False)
        except LogCorrupt as e:
            raise ValueError(f"resume refused, no torn state is loaded: {e}") from None
        moved = getattr(session.persistence, "moved_aside", None)
        if moved is not None:
            self.get_logger().warning(f"persist_dir {directory}: a log this runtime cannot continue was moved to "
                                      f"{moved}")
        if report is None:
            self.get_logger().info(f"persisting capsules to {directory} (resume off: starting fresh)")
            return ""
        if not report.capsule_id:
            self.get_logger().info(f"resume: no capsule log in {directory} yet, starting fresh")
            return ""
        self.get_logger().info(f"{report.summary()}; persisting to {directory}")
        return report.summary()

    def on_cleanup(self, state: State | None) -> TransitionCallbackReturn:
        destroy = getattr(self, "destroy_lifecycle_publisher", self.destroy_publisher)
        for pub in self._topic_pubs.values():
            destroy(pub)
        self._topic_pubs = {}
        if self.session is not None:
            self.session.disable_persistence()  # writes what is queued and fsyncs
        self.session = self._reader = self._capsule_dir = None
        self._last_usage = None
        self.hardware_id = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State | None) -> TransitionCallbackReturn:
        self.release()
        return TransitionCallbackReturn.SUCCESS

    def release(self) -> None:
        """Stop serving and free the runtime, whatever the state (shutdown path)."""
        if self._observation_sub is not None or self._replan_server is not None:
            self.on_deactivate(None)
        if self.session is not None:
            self.on_cleanup(None)

    def destroy_node(self):
        logging.getLogger(RUNTIME_LOGGER).removeHandler(self._log_handler)
        return super().destroy_node()

    # ---- stepping -------------------------------------------------------------------------
    def on_observation(self, msg) -> None:
        # [replan] while a replan runs, the latest observation is held and the replan thread steps it
        # between two batched steps (ReplanServer.hold / LiveGate)
        if self._replan_server is not None and self._replan_server.hold(msg):
            return
        self.step_from_message(msg)

    def step_from_message(self, msg) -> None:
        session, reader = self.session, self._reader
        if session is None or reader is None:
            return
        try:
            learning = not reader.joint_names
            obs = reader(msg)
        except ValueError as e:  # counted; the state is untouched
            self.stats.rejected += 1
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        if learning and reader.learned:
            self.get_logger().info(f"joint order taken from the first JointState and enforced from now on: "
                                   f"{reader.joint_names} (set joint_names to fix it in advance)")
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
        except ValueError as e:  # refused before it ran: the state is untouched
            self.stats.rejected += 1
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
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

    # ---- diagnostics ----------------------------------------------------------------------
    def _store_usage(self, session):
        """The store's usage without waiting: while a replan holds the runtime lock, the last one."""
        if session is None:
            return None
        if session.lock.acquire(blocking=False):
            try:
                self._last_usage = session.store_usage()
            finally:
                session.lock.release()
        return self._last_usage

    def publish_diagnostics(self) -> None:
        try:
            session = self.session
            msg = diagnostics_message(self.get_fully_qualified_name(), self.lifecycle_state(), self.hardware_id,
                                      self.stats, session, self._store_usage(session),
                                      float(self.get_parameter("step_deadline_ms").value))
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diagnostics_pub.publish(msg)
        except Exception as e:  # noqa: BLE001 - a diagnostics hiccup must not stop the node
            self.get_logger().error(f"diagnostics failed: {type(e).__name__}: {e}", throttle_duration_sec=10.0)


def _init_ros(args) -> None:
    """rclpy.init without rclpy's signal handlers: on SIGINT the node must stop its replan worker
    while the context is still valid (rclpy's handler would shut the context down under it)."""
    try:
        from rclpy.signals import SignalHandlerOptions
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except (ImportError, TypeError):  # an rclpy without the option
        rclpy.init(args=args)


def _one_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text.split(", at /")[0]  # rcl appends C source locations


def spin_until_stopped(executor, node, stop: threading.Event) -> None:
    while not stop.is_set() and rclpy.ok():
        try:
            executor.spin_once(timeout_sec=0.1)  # wakes at least every 0.1 s to see a stop request
        except (KeyboardInterrupt, ExternalShutdownException):
            return
        except Exception as e:  # noqa: BLE001 - a callback's error must not take the robot's policy down
            node.get_logger().error(f"callback failed: {type(e).__name__}: {_one_line(e)}",
                                    throttle_duration_sec=1.0)


def main(args=None) -> int:
    # SIGINT / SIGTERM only ask the loop to stop, from the start: shutdown then runs in order
    # (replan worker, services, node, context) and exits 0, even mid-configure or mid-replan.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _init_ros(args if args is not None else sys.argv)
    except Exception as e:  # noqa: BLE001 - e.g. a params file that is missing or not valid YAML
        print(f"flashrt: cannot start: {_one_line(e)}", file=sys.stderr)
        return 2
    code = 0
    node = executor = None
    try:
        node = FlashRTNode(argv=args if args is not None else sys.argv)
        # SingleThreaded, not EventsExecutor: rclpy 9.1's EventsExecutor hung at 100% CPU serving an
        # action goal here (even a plain synchronous one); see README. Humble has no EventsExecutor anyway.
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        if check_node_param("autostart", node.get_parameter("autostart").value) and not stop.is_set():
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                code = 1
            elif node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                code = 1
        if code == 0:
            spin_until_stopped(executor, node, stop)
    except Exception as e:  # noqa: BLE001 - start-up errors: one line, not a traceback
        print(f"flashrt: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        code = 1
    finally:
        if node is not None:
            node.release()  # the replan worker stops while the context still works
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
