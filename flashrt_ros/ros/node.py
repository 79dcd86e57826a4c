"""The flashrt lifecycle node: parameters -> Session; one policy step per observation; capsule
services and the Replan action; /diagnostics. Lifecycle and wiring only: what an observation becomes is
stepping.py, the services are services/, the node's role in a group (stream, replica, standby takeover,
leader) is group/roles.py, and the process around the node (start-up, signals, teardown) is main.py.

    on_configure  validate parameters, allocate, load weights, warm up, capture (Session)
    on_activate   subscribe 'observation', enable the publishers, open services + 'replan'
    on_deactivate stop all of that; on_cleanup  release the Session
    services, 'replan' and /diagnostics exist in every state; while not active a call or goal is refused at
    once, naming the state (services/state_gate.py). Every transition logs one line.

With ``autostart`` (the default) the node configures and activates itself; without it, a lifecycle
manager or ``ros2 lifecycle set <node> configure`` then ``... activate`` brings it up.
"""
from __future__ import annotations

import logging
import time

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray

from ..runtime.session import Session
from ..runtime.state.capsule_file import load_hmac_key
from .declare import command_line_overrides, declare_all, guard_live_params, read_config
from .group.roles import GroupRole, robot_topic
from .io.convert import ObservationReader
from .io.diagnostics import device_name, diagnostics_message
from .io.outputs import ActionOutputs, action_joint_names
from .io.policy_step import PolicyStepLink
from .io.qos import resolve_profiles
from .io.stats import NodeStats
from .params import check_node_param
from .persistence import start_persistence
from .platform.gc_freeze import GcFreezer, collect_and_freeze, thaw
from .services.capsule_dir import CapsuleDir
from .services.state_gate import GatedCapsuleServices, GatedReplanServer, inactive_refusal
from .stepping import Stepper

NODE_NAME = "flashrt"
RUNTIME_LOGGER = "flashrt_ros"  # Python logging of the runtime, forwarded to the ROS log


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
        """``argv``: the process's ROS arguments, to recover ``-p`` values rclpy would drop (declare.py)."""
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
        self.hardware_id = "unconfigured"
        self._own: dict = {}
        self._outputs: ActionOutputs | None = None
        self._stepper: Stepper | None = None  # from configure to cleanup
        self._last_stamp_ns = 0  # the last stepped stamp, kept over a cleanup
        self._group: GroupRole | None = None  # from the first configure on (a takeover's role outlives a cleanup)
        self._qos: dict = {}
        self._active = False  # the gate of services and replan (state_gate)
        self._policy_step = PolicyStepLink(self, lambda: self.robot_topic("policy_step"),
                                           lambda: self._qos["policy_step"])
        self._observation_sub = None
        self._last_usage = None
        # /diagnostics is a plain publisher on a timer made here: it reports every lifecycle state,
        # so a supervisor sees an inactive node as inactive instead of as stale.
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        try:
            period = check_node_param("diagnostics_period_s", self.get_parameter("diagnostics_period_s").value)
        except ValueError:
            period = 1.0  # configure fails and names the parameter
        self.create_timer(period, self.publish_diagnostics)
        try:
            gc_period = check_node_param("gc_freeze_period_s", self.get_parameter("gc_freeze_period_s").value)
        except ValueError:
            gc_period = 5.0  # configure fails and names the parameter
        self._gc_freezer = GcFreezer(self, gc_period)
        # created once, as nav2 servers are: they answer in every state (refusing while not active)
        self._capsule_services = GatedCapsuleServices(self, None)
        self._replan_server = GatedReplanServer(self)
        self._servers_open = True

    @property
    def last_stamp_ns(self) -> int:
        """The stamp of the last observation stepped (0 before one): a snapshot's stamp."""
        return self._stepper.last_stamp_ns if self._stepper is not None else self._last_stamp_ns

    # ---- what the services ask of the node -------------------------------------------------------
    def role_refusal(self, what: str) -> str:
        """'' when this node's role serves ``what`` (a service name, or 'a committing replan')."""
        return self._group.role_refusal(what) if self._group is not None else ""

    def commit_forwarder(self):
        """A replica's (or a standby's, before it takes over) link to its primary, where commits go."""
        return self._group.replica if self._group is not None else None

    def robot_topic(self, name: str) -> str:
        return robot_topic(self._own.get("robot_namespace"), name)

    def live_state_replaced(self) -> None:
        """The live state no longer continues the steps published so far (rollback, reset, a restoring import):
        policy_step's history starts afresh (io/policy_step.py). A service worker thread, never the executor."""
        self._policy_step.forget_history()

    def replan_nice(self) -> int:
        """replan_nice as the last configure read it (0 before one)."""
        return self._own["replan_nice"] if self._own else 0

    def inactive_refusal(self) -> str:
        """'' while active; otherwise why a service call or replan goal is refused, naming the state."""
        return "" if self._active else inactive_refusal(self.lifecycle_state())

    def _transition_failed(self, transition: str, err: Exception) -> TransitionCallbackReturn:
        # rclpy turns an exception in a transition into ERROR without a word: say what happened
        self.get_logger().error(f"{transition} failed: {type(err).__name__}: {one_line(err)}")
        return TransitionCallbackReturn.ERROR

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
            out_names = action_joint_names(own["action_joint_names"], cfg.action_dim)
            qos = resolve_profiles(self, own["observation_reliable"], own["publish_trajectory"])
            t0 = time.perf_counter()
            session = Session(cfg, own["backend"])
            session.prepare_replans()
            if own["capsule_hmac_key_file"]:
                session.capsule_hmac_key = load_hmac_key(own["capsule_hmac_key_file"])
            self.resume_summary = start_persistence(session, own, self.get_logger())
        except Exception as e:  # noqa: BLE001 - any configuration error fails the transition, clearly
            self.get_logger().error(f"configure failed: {' '.join(str(e).split())}")
            return TransitionCallbackReturn.FAILURE
        self.session, self._own = session, own
        self._group = GroupRole(self, session, own, self.step_from_message, self._lead_at)
        for stale in capsule_dir.sweep_stale_temporaries():
            self.get_logger().warning(f"removed {stale.name} from capsule_dir: the temporary of an export whose "
                                      "process died mid-write")
        self._capsule_services.capsule_dir, self._qos = capsule_dir, qos
        self.hardware_id = device_name(session.backend)
        usage = session.store_usage()
        if self._gc_freezer.timer is not None:
            collect_and_freeze()  # the session's objects: never walked by the collector again
        self.get_logger().info(
            f"configure: done in {(time.perf_counter() - t0) * 1e3:.0f} ms: backend {session.backend.name} on "
            f"{self.hardware_id}, {len(session.plan.ops)} ops, {usage.capacity} capsule slots, "
            f"fingerprint {session.fingerprint[:12]}, capsule_dir {capsule_dir.root}; now inactive")
        # Lifecycle publishers: nothing goes out on them unless the node is active. policy_step is made on
        # activate instead (io/policy_step.py).
        self._outputs = ActionOutputs(self, cfg.action_dim, cfg.chunk_len, out_names, own["publish_trajectory"],
                                      own["control_period_s"], qos, self.robot_topic,
                                      units=(session.weights["action_scale"], session.weights["action_offset"]))
        if own["publish_trajectory"] and not own["action_joint_names"]:
            self.get_logger().warning(f"action_joint_names is unset: 'action_trajectory' names the joints "
                                      f"{out_names[0]} .. {out_names[-1]}, which no controller knows; set "
                                      "action_joint_names to the controller's joints")
        self._stepper = Stepper(session, reader, self._outputs, self._policy_step, self.stats, self.get_logger(),
                                self.get_clock(), own["max_future_stamp_ms"],
                                lambda: self.get_parameter("step_deadline_ms").value, self._last_stamp_ns,
                                self._group.fenced)
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        try:
            msg_type = JointState if self._own["observation_type"] == "joint_state" else Float32MultiArray
            super().on_activate(state)  # enables the lifecycle publishers
            group = self._group
            if group.role == "replica":
                return self._now_active(group.follow_primary())
            group.guard_leadership()
            self._observation_sub = self.create_subscription(msg_type, self.robot_topic("observation"),
                                                             group.on_observation,
                                                             group.observation_qos(self._qos["observation"]))
            self._policy_step.renew()  # a standby's too: matched by subscribers before it takes over
            if group.role == "standby":
                return self._now_active(group.stand_by())
            group.lead(epoch=1)
        except Exception as e:  # noqa: BLE001 - logged, then rclpy's error processing (on_error)
            return self._transition_failed("activate", e)
        self._active = True
        stream = (f", capsule records on '{self.get_fully_qualified_name()}/capsule_stream' once its start hold "
                  "is over" if self._own["capsule_stream"] else "")
        self.get_logger().info(f"activate: now active, stepping on '{self._observation_sub.topic_name}' "
                               f"({msg_type.__name__}){stream}; services and replan open")
        if msg_type is JointState and not self._own["joint_names"]:
            self.get_logger().warning("joint_names is unset: JointState values are taken in message order and "
                                      "their names are not checked; set joint_names to map joints by name and "
                                      "refuse messages from a publisher with other joints")
        return TransitionCallbackReturn.SUCCESS

    def _now_active(self, line: str) -> TransitionCallbackReturn:
        self._active = True
        self.get_logger().info(line)
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: State | None) -> TransitionCallbackReturn:
        self._active = False  # from here every call and goal is refused
        # The running replan first: it may still publish feedback, which needs a live node and context.
        if self._replan_server is not None and not self._replan_server.stop_running("the node is deactivating"):
            self.get_logger().warning("deactivate: the running replan did not stop in time; it ends on its own")
        if self._group is not None:
            self._group.deactivate()
        if self._observation_sub is not None:
            self.destroy_subscription(self._observation_sub)
        self._observation_sub = None
        self._policy_step.renew(recreate=False)  # an inactive node offers no steps to late joiners
        super().on_deactivate(state)  # disables the lifecycle publishers
        if state is not None:  # None: release() on the way out, which logs its own line
            self.get_logger().info("deactivate: now inactive, not stepping; services and replan refuse calls")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: State | None) -> TransitionCallbackReturn:
        self._policy_step.destroy()
        if self._outputs is not None:
            self._outputs.destroy()
        self._outputs = None
        if self.session is not None:
            self.session.disable_persistence()  # writes what is queued and fsyncs
        self._last_stamp_ns = self.last_stamp_ns
        self.session = self._stepper = None
        if self._gc_freezer.timer is not None:
            thaw()  # frozen objects are never collected: the released session's cycles go now
        if self._capsule_services is not None:
            self._capsule_services.capsule_dir = None
        self._last_usage = None
        self.hardware_id = "unconfigured"
        if state is not None:
            self.get_logger().info("cleanup: runtime released, now unconfigured")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State | None) -> TransitionCallbackReturn:
        self.release()
        self.get_logger().info(f"shutdown: from {state.label if state is not None else 'unknown'}, services "
                               "and replan closed, runtime released, now finalized")
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State | None) -> TransitionCallbackReturn:
        """A transition raised (logged by _transition_failed or not at all by rclpy): free everything and
        go back to unconfigured, from where configure can be tried again."""
        self._active = False
        try:
            if self._observation_sub is not None:
                self.on_deactivate(None)
            if self.session is not None:
                self.on_cleanup(None)
        except Exception as e:  # noqa: BLE001 - cannot recover: finalized
            self.get_logger().error(f"error: recovery failed ({type(e).__name__}: {one_line(e)}), now finalized")
            return TransitionCallbackReturn.FAILURE
        self.get_logger().error(f"error: a transition from {state.label if state is not None else 'unknown'} "
                                "failed; runtime released, now unconfigured")
        return TransitionCallbackReturn.SUCCESS

    def release(self) -> None:
        """Stop serving and free the runtime, whatever the state (shutdown path). Idempotent."""
        if self._observation_sub is not None or self._active:
            self.on_deactivate(None)
        if self.session is not None or self._outputs is not None:
            self.on_cleanup(None)
        if self._servers_open:
            self._servers_open = False
            self._replan_server.destroy("the node is shutting down")
            self._capsule_services.destroy()

    def destroy_node(self):
        logging.getLogger(RUNTIME_LOGGER).removeHandler(self._log_handler)
        return super().destroy_node()

    # ---- stepping (stepping.py) ----------------------------------------------------------------
    def _lead_at(self, epoch: int) -> None:
        """Every command carries this node's epoch from here on (io/fence.py)."""
        if self._outputs is not None:
            self._outputs.set_epoch(epoch)

    def step_from_message(self, msg) -> None:
        stepper = self._stepper
        if stepper is not None:  # None: not configured, or cleaned up meanwhile
            stepper.step_from_message(msg)

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
            role = self._group.diagnostics() if self._group is not None else ({"role": "primary"}, "")
            msg = diagnostics_message(self.get_fully_qualified_name(), self.lifecycle_state(), self.hardware_id,
                                      self.stats, session, self._store_usage(session),
                                      float(self.get_parameter("step_deadline_ms").value), role)
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diagnostics_pub.publish(msg)
        except Exception as e:  # noqa: BLE001 - a diagnostics hiccup must not stop the node
            self.get_logger().error(f"diagnostics failed: {type(e).__name__}: {e}", throttle_duration_sec=10.0)


def one_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text.split(", at /")[0]  # rcl appends C source locations


