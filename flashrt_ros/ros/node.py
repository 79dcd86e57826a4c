"""The flashrt lifecycle node: parameters -> Session; one policy step per observation; capsule
services and the Replan action; /diagnostics.

    on_configure  validate parameters, allocate, load weights, warm up, capture (Session)
    on_activate   subscribe 'observation', enable the publishers, open services + 'replan'
    on_deactivate stop all of that; on_cleanup  release the Session
    services, 'replan' and /diagnostics exist in every state; while not active a call or goal is refused at
    once, naming the state (state_gate.py). Every transition logs one line.

With ``autostart`` (the default) the node configures and activates itself; without it, a lifecycle
manager or ``ros2 lifecycle set <node> configure`` then ``... activate`` brings it up.

Run: ``ros2 run flashrt_ros flashrt_node --ros-args --params-file config/flashrt.yaml``
"""
from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn
from rclpy.qos import QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Header

from flashrt_interfaces.msg import PolicyStep

from ..runtime.errors import CapsuleError, FingerprintMismatch, NonFiniteAction
from ..runtime.inputs import check_stamp_ns
from ..runtime.persist.format import LogCorrupt
from ..runtime.persist.writer import PersistSettings
from ..runtime.session import Session
from ..runtime.state.capsule_file import load_hmac_key
from .capsule_dir import CapsuleDir
from .capsule_stream import StreamPublisher
from .convert import JointNamesMismatch, ObservationReader, stamp_to_ns
from .dds_profile import default_fast_dds_ports, use_shipped_profile
from .dead_participants import HeldIds, hold_dead_participant_ids, own_participant_ids, planted_port_files
from .diagnostics import device_name, diagnostics_message
from .freed_memory import keep_freed_memory
from .gc_freeze import GcFreezer, collect_and_freeze, thaw
from .leader import LEADER_TOPIC, LeaderGuard
from .node_stats import NodeStats
from .outputs import ActionOutputs, action_joint_names
from .params import check_node_param, command_line_overrides, declare_all, guard_live_params, read_config
from .qos import resolve_profiles
from .realtime import apply_thread_priority
from .replica import ReplicaLink, role_diagnostics
from .roles import NodeRoles
from .shm_segments import removal_line, remove_dead_segments, skipped_line
from .standby import StandbyLink
from .state_gate import GatedCapsuleServices, GatedReplanServer, inactive_refusal

NODE_NAME = "flashrt"
RUNTIME_LOGGER = "flashrt_ros"  # Python logging of the runtime, forwarded to the ROS log
STANDBY_OBSERVATION_DEPTH = 200  # a standby's observation queue: 2 s at 100 Hz, past any takeover's catch-up
POLICY_STEP_ACK_WAIT_S = 0.1  # before a policy_step writer goes: time for subscribers to acknowledge its last steps
POLICY_STEP_RENEW_WAIT_S = 2.0  # a service waits this long for the executor to renew the policy_step writer
# After a rollback or reset the replaced policy_step writer stays (publishing nothing) until its subscribers
# acknowledge its steps, or this long: a writer destroyed while a subscriber has not yet processed its last steps
# takes them with it. Acknowledgements often wait for the rmw's periodic heartbeat (seconds), while delivery
# takes milliseconds, so the bound is the time a subscriber's DDS threads may stay descheduled on a loaded machine.
POLICY_STEP_RETIRE_WAIT_S = 0.3


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


class FlashRTNode(NodeRoles, LifecycleNode):
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
        self._topic_pubs: dict = {}  # policy_step
        self._outputs: ActionOutputs | None = None
        self._qos: dict = {}
        self._active = False  # the gate of services and replan (state_gate)
        self._policy_step_lock = threading.Lock()  # the policy_step writer: publishing vs replacing it
        self._policy_step_history = False  # the writer has published since it was made
        self._observation_sub = None
        self._stream: StreamPublisher | None = None  # role primary, capsule_stream on: while active
        self._replica: ReplicaLink | None = None  # role replica or standby: while active (until a takeover)
        self._leader: LeaderGuard | None = None  # primary and standby: while active
        self._deposed = ""  # why this node stopped leading (a standby took over): it steps nothing more
        self._last_usage = None
        # /diagnostics is a plain publisher on a timer made here: it reports every lifecycle state,
        # so a supervisor sees an inactive node as inactive instead of as stale.
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        try:
            period = check_node_param("diagnostics_period_s", self.get_parameter("diagnostics_period_s").value)
        except ValueError:
            period = 1.0  # configure fails and names the parameter
        self._diagnostics_timer = self.create_timer(period, self.publish_diagnostics)
        try:
            gc_period = check_node_param("gc_freeze_period_s", self.get_parameter("gc_freeze_period_s").value)
        except ValueError:
            gc_period = 5.0  # configure fails and names the parameter
        self._gc_freezer = GcFreezer(self, gc_period)
        # created once, as nav2 servers are: they answer in every state (refusing while not active)
        self._capsule_services = GatedCapsuleServices(self, None)
        self._replan_server = GatedReplanServer(self)
        self._servers_open = True

    def replan_nice(self) -> int:
        """replan_nice as the last configure read it (0 before one)."""
        return self._own["replan_nice"] if self._own else 0

    def inactive_refusal(self) -> str:
        """'' while active; otherwise why a service call or replan goal is refused, naming the state."""
        return "" if self._active else inactive_refusal(self.lifecycle_state())

    def _transition_failed(self, transition: str, err: Exception) -> TransitionCallbackReturn:
        # rclpy turns an exception in a transition into ERROR without a word: say what happened
        self.get_logger().error(f"{transition} failed: {type(err).__name__}: {_one_line(err)}")
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
            self.resume_summary = self._start_persistence(session, own)
        except Exception as e:  # noqa: BLE001 - any configuration error fails the transition, clearly
            self.get_logger().error(f"configure failed: {' '.join(str(e).split())}")
            return TransitionCallbackReturn.FAILURE
        self.session, self._own, self._capsule_dir, self._reader = session, own, capsule_dir, reader
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
        # activate instead (see _renew_policy_step_writer).
        self._outputs = ActionOutputs(self, cfg.action_dim, cfg.chunk_len, out_names, own["publish_trajectory"],
                                      own["control_period_s"], qos, self.robot_topic,
                                      units=(session.weights["action_scale"], session.weights["action_offset"]))
        if own["publish_trajectory"] and not own["action_joint_names"]:
            self.get_logger().warning(f"action_joint_names is unset: 'action_trajectory' names the joints "
                                      f"{out_names[0]} .. {out_names[-1]}, which no controller knows; set "
                                      "action_joint_names to the controller's joints")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        try:
            msg_type = JointState if self._own["observation_type"] == "joint_state" else Float32MultiArray
            super().on_activate(state)  # enables the lifecycle publishers
            self._deposed = ""
            if self._own["role"] == "replica":
                return self._activate_replica(ReplicaLink(self, self.session, self._own["primary"], follow_leader=True))
            self._leader = LeaderGuard(self, self.robot_topic(LEADER_TOPIC), self._on_deposed)
            qos = self._qos["observation"]
            if self._own["role"] == "standby":  # held from its newest record on, and never dropped while it takes over
                qos = QoSProfile(history=qos.history, depth=max(qos.depth, STANDBY_OBSERVATION_DEPTH),
                                 reliability=qos.reliability, durability=qos.durability)
            self._observation_sub = self.create_subscription(msg_type, self.robot_topic("observation"),
                                                             self.on_observation, qos)
            self._renew_policy_step_writer()  # a standby's too: matched by subscribers before it takes over
            if self._own["role"] == "standby":
                return self._activate_replica(StandbyLink(self, self.session, self._own["primary"],
                                                          self._own["liveliness_lease_ms"], self._take_over,
                                                          self._own["standby_takeover_delay_ms"]))
            self._lead(epoch=1)
        except Exception as e:  # noqa: BLE001 - logged, then rclpy's error processing (on_error)
            return self._transition_failed("activate", e)
        self._active = True
        stream = f", capsule records on '{self._stream.pub.topic_name}'" if self._stream is not None else ""
        self.get_logger().info(f"activate: now active, stepping on '{self._observation_sub.topic_name}' "
                               f"({msg_type.__name__}){stream}; services and replan open")
        if msg_type is JointState and not self._own["joint_names"]:
            self.get_logger().warning("joint_names is unset: JointState values are taken in message order and "
                                      "their names are not checked; set joint_names to map joints by name and "
                                      "refuse messages from a publisher with other joints")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: State | None) -> TransitionCallbackReturn:
        self._active = False  # from here every call and goal is refused
        # The running replan first: it may still publish feedback, which needs a live node and context.
        if self._replan_server is not None and not self._replan_server.stop_running("the node is deactivating"):
            self.get_logger().warning("deactivate: the running replan did not stop in time; it ends on its own")
        for link in (self._stream, self._replica, self._leader):
            if link is not None:
                link.destroy()
        self._stream = self._replica = self._leader = None
        if self._observation_sub is not None:
            self.destroy_subscription(self._observation_sub)
        self._observation_sub = None
        self._renew_policy_step_writer(recreate=False)  # an inactive node offers no steps to late joiners
        super().on_deactivate(state)  # disables the lifecycle publishers
        if state is not None:  # None: release() on the way out, which logs its own line
            self.get_logger().info("deactivate: now inactive, not stepping; services and replan refuse calls")
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
            report = session.enable_persistence(settings, resume=own["resume"],
                                                fresh_on_mismatch=own["resume_fresh_on_mismatch"])
        except FingerprintMismatch as e:
            raise ValueError(f"{e}. Point persist_dir elsewhere, or set resume_fresh_on_mismatch:=true to move "
                             "that log aside and start fresh") from None
        except LogCorrupt as e:
            raise ValueError(f"resume refused, no torn state is loaded: {e}") from None
        mismatch_moved = session.persistence.mismatch_moved
        if mismatch_moved is not None:
            self.get_logger().warning(f"persist_dir {directory}: the log was written by another config, weights or "
                                      f"plan; moved to {mismatch_moved}, starting fresh")
        moved = getattr(session.persistence, "moved_aside", None)
        if moved is not None:
            self.get_logger().warning(f"persist_dir {directory}: the old log (resume off, or one this runtime "
                                      f"cannot continue) was moved to {moved}, where no resume reads it")
        if report is None:
            self.get_logger().info(f"persisting capsules to {directory} (resume off: starting fresh)")
            return ""
        if not report.capsule_id and not report.capsules:  # (a reset before the crash: capsules, none live)
            self.get_logger().info(f"resume: no capsule log in {directory} yet, starting fresh")
            return ""
        self.get_logger().info(f"{report.summary()}; persisting to {directory}")
        return report.summary()

    # ---- policy_step history ----------------------------------------------------------------
    # policy_step is transient-local (step_link: a client's first answer must survive the DDS match), so its
    # writer hands its last steps to every late subscriber. Those must be steps of the live timeline: on a
    # rollback, a reset, a restoring import and while inactive the writer is replaced by
    # one with an empty history. The replacement is made ahead (the spare, which never publishes), so the
    # subscribers have matched it when it takes over: a writer made at the swap would drop, for a subscriber
    # that has not matched it yet, every step beyond its history depth (a volatile one gets none of them).
    def _renew_policy_step_writer(self, recreate: bool = True) -> None:
        """Executor thread only (DDS entities are made and destroyed there): a fresh writer and spare, or
        none (recreate=False, inactive). What current subscribers have not yet acknowledged is briefly
        waited for (deactivate: nothing more is stepped)."""
        with self._policy_step_lock:  # never the runtime lock: not needed to swap a DDS writer
            old = self._topic_pubs.pop("policy_step", None)
            spare = self._topic_pubs.pop("policy_step_spare", None)
            if old is not None:
                try:
                    old.wait_for_all_acked(Duration(seconds=POLICY_STEP_ACK_WAIT_S))
                except Exception:  # noqa: BLE001 - an rmw without the call: the history goes anyway
                    pass
                self.destroy_publisher(old)
            if recreate:
                self._topic_pubs["policy_step"] = spare or self._policy_step_writer()
                self._topic_pubs["policy_step_spare"] = self._policy_step_writer()
            elif spare is not None:
                self.destroy_publisher(spare)
            self._policy_step_history = False

    def _policy_step_writer(self):
        return self.create_publisher(PolicyStep, self.robot_topic("policy_step"), self._qos["policy_step"])

    def live_state_replaced(self) -> None:
        """The live state no longer continues the steps published so far (rollback, reset, a restoring
        import): start policy_step's history afresh. Called from a service worker thread, never the
        executor.

        The spare takes the next steps; the old writer, publishing nothing more, stays until its subscribers
        have acknowledged what it sent, or POLICY_STEP_RETIRE_WAIT_S. Both waits poll from here: rmw's
        blocking wait holds the GIL, and would stop the executor stepping. Returns once the old writer is
        gone, so a subscriber that joins after the answer gets no step of the timeline that was left."""
        with self._policy_step_lock:
            if not self._policy_step_history:  # nothing to forget (rollbacks back to back cost nothing here)
                return
        if self.executor is None:
            self._renew_policy_step_writer("policy_step" in self._topic_pubs)
            return
        _poll_until(self._spare_matched, POLICY_STEP_RENEW_WAIT_S)  # a spare made by the last swap
        retired = self._on_executor(self._swap_policy_step_writer, self._destroy_retired_writer)
        if retired is None:
            return
        _poll_until(lambda: _all_acked(retired), POLICY_STEP_RETIRE_WAIT_S)
        self._on_executor(lambda: self._destroy_retired_writer(retired), None)

    def _spare_matched(self) -> bool:
        """The spare has matched as many subscribers as the live writer (or the node is no longer active)."""
        try:
            live, spare = self._topic_pubs.get("policy_step"), self._topic_pubs.get("policy_step_spare")
            return live is None or spare is None or spare.get_subscription_count() >= live.get_subscription_count()
        except Exception:  # noqa: BLE001 - destroyed meanwhile (deactivate): nothing to wait for
            return True

    def _swap_policy_step_writer(self):
        """Executor thread: the spare becomes the writer, a new spare is made; returns the replaced writer
        (None while inactive)."""
        with self._policy_step_lock:
            old = self._topic_pubs.get("policy_step")
            if old is not None:
                self._topic_pubs["policy_step"] = self._topic_pubs.pop("policy_step_spare", None) or \
                    self._policy_step_writer()
                self._topic_pubs["policy_step_spare"] = self._policy_step_writer()
            self._policy_step_history = False
        return old

    def _destroy_retired_writer(self, writer) -> None:
        if writer is not None:
            self.destroy_publisher(writer)

    def _on_executor(self, fn, undo):
        """fn() run by the executor; its result, or None when it did not run within POLICY_STEP_RENEW_WAIT_S
        (then `undo` gets the result whenever fn does run)."""
        state = {"result": None, "waiting": True}
        lock, ran = threading.Lock(), threading.Event()

        def task() -> None:
            result = fn()
            with lock:
                state["result"], waiting = result, state["waiting"]
            ran.set()
            if not waiting and undo is not None:
                undo(result)

        try:
            self.executor.create_task(task)
        except Exception:  # noqa: BLE001 - the executor is shutting down: the writers go with the node
            return None
        ran.wait(POLICY_STEP_RENEW_WAIT_S)
        with lock:
            state["waiting"] = False
            if not ran.is_set():
                self.get_logger().warning("policy_step history not renewed in time: a late subscriber may still "
                                          "get steps from before the rollback or reset")
            return state["result"]

    def on_cleanup(self, state: State | None) -> TransitionCallbackReturn:
        for pub in self._topic_pubs.values():
            self.destroy_publisher(pub)
        self._topic_pubs = {}
        if self._outputs is not None:
            self._outputs.destroy()
        self._outputs = None
        if self.session is not None:
            self.session.disable_persistence()  # writes what is queued and fsyncs
        self.session = self._reader = self._capsule_dir = None
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
            self.get_logger().error(f"error: recovery failed ({type(e).__name__}: {_one_line(e)}), now finalized")
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

    # ---- stepping -------------------------------------------------------------------------
    def on_observation(self, msg) -> None:
        # [replan] stepped here even while a replan runs: the replan computes its batched steps outside the
        # runtime lock, so this step waits at most for one of its bookkeeping sections (runtime/replan.py)
        if self._replica is not None:  # a standby, while the primary leads
            self._replica.hold(msg)
        elif not self._deposed:
            self.step_from_message(msg)

    def step_from_message(self, msg) -> None:
        session, reader = self.session, self._reader
        if session is None or reader is None:
            return
        try:
            obs = reader(msg)
        except JointNamesMismatch as e:  # another publisher, or a wrong joint_names: an error on /diagnostics
            self.stats.joint_name_mismatch(str(e))
            self.get_logger().error(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        except ValueError as e:  # counted; the state is untouched
            self.stats.count("rejected")
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        header = getattr(msg, "header", None)
        stamp = header.stamp if header is not None else None
        now = self.get_clock().now()
        if stamp is None or (stamp.sec == 0 and stamp.nanosec == 0):  # none (a float array) or never set
            stamp = now.to_msg()
            self.stats.count("stamps_from_clock")
        try:  # a stamp before 1970 would make capsules no file or record can carry; the state is untouched
            stamp_ns = check_stamp_ns(stamp_to_ns(stamp))
        except ValueError as e:
            self.stats.count("rejected")
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        ahead_ms = (stamp_ns - now.nanoseconds) / 1e6
        # a wrong clock: refused, the state untouched (a sim clock still at 0, before /clock: nothing to compare)
        if now.nanoseconds > 0 and ahead_ms > self._own["max_future_stamp_ms"]:
            self.stats.count("rejected")
            self.stats.count("stamps_in_future")
            self.get_logger().warning(f"observation rejected: stamped {ahead_ms:.0f} ms ahead of this node's clock "
                                      f"(max_future_stamp_ms {self._own['max_future_stamp_ms']:g}): the sensor's "
                                      "clock is wrong, or not synchronised with this computer's",
                                      throttle_duration_sec=1.0)
            return
        self.last_stamp_ns = stamp_ns

        outputs = self._outputs
        if outputs is None:  # cleaned up meanwhile
            return
        publish_action = outputs.publish_action

        # the step and its policy_step as one: a rollback comes before both or after both, so a renewed
        # history never starts with a step of the timeline that was left
        with session.lock:
            self._step_and_publish(session, obs, stamp, header, publish_action)

    def _step_and_publish(self, session, obs, stamp, header, publish_action) -> None:
        try:
            res = session.step(obs, self.last_stamp_ns, on_action=publish_action)
        except NonFiniteAction as e:  # nothing went out; the state is as before this step
            self.stats.step_refused(str(e))
            self.get_logger().error(str(e), throttle_duration_sec=1.0)
            return
        except CapsuleError as e:  # the step ran and the action went out; only the capsule is missing
            self.stats.count("capsule_errors")
            self.get_logger().error(f"no capsule for this step: {e}", throttle_duration_sec=1.0)
            return
        except ValueError as e:  # refused before it ran: the state is untouched
            self.stats.count("rejected")
            self.get_logger().warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        missed = res.latency_ms > self.get_parameter("step_deadline_ms").value
        self.stats.add_step(res.latency_ms, missed)
        if missed:
            self.get_logger().warning(f"step took {res.latency_ms:.2f} ms", throttle_duration_sec=1.0)
        msg = PolicyStep(
            header=Header(stamp=stamp, frame_id=header.frame_id if header is not None else ""),
            step=res.step, capsule_id=res.capsule_id, action=res.action.tolist(),
            action_chunk=res.chunk.ravel().tolist(), chunk_len=session.cfg.chunk_len,
            step_latency_ms=res.latency_ms)
        self._outputs.publish_trajectory(msg.header, res.chunk)
        with self._policy_step_lock:
            writer = self._topic_pubs.get("policy_step")
            if writer is not None:  # None: deactivated meanwhile
                writer.publish(msg)
                self._policy_step_history = True

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
                                      float(self.get_parameter("step_deadline_ms").value),
                                      role_diagnostics(self._own.get("role", "primary"), self._stream, self._replica,
                                                       self._leader, self._deposed))
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diagnostics_pub.publish(msg)
        except Exception as e:  # noqa: BLE001 - a diagnostics hiccup must not stop the node
            self.get_logger().error(f"diagnostics failed: {type(e).__name__}: {e}", throttle_duration_sec=10.0)


def _all_acked(writer) -> bool:
    try:
        return writer.wait_for_all_acked(Duration(seconds=0))  # a poll: no wait, so the GIL is not held
    except Exception:  # noqa: BLE001 - an rmw without the call, or destroyed meanwhile: nothing to wait for
        return True


def _poll_until(done, timeout_s: float, period_s: float = 0.005) -> bool:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(period_s)
    return True


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


# Fast DDS 3.2 can deadlock destroying a participant while a peer leaves (eProsima/Fast-DDS#6502): the process
# would never exit, and a launch file or systemd would wait on it. Past this limit after the runtime is released
# (the capsule log flushed), every thread's stack goes to stderr and the process exits 1 without the rest.
TEARDOWN_LIMIT_S = 20.0
# SIGINT / SIGTERM end the node within this, whatever it is doing: a start-up blocked in a system call (a FIFO
# planted where a file was expected once hung it for good, SIGTERM ignored), a configure still compiling, or
# the teardown above. Past it every thread's stack goes to stderr and the process exits 1 (the capsule log is
# safe against that, as against kill -9). Under 5 s: systemd's and launch's SIGKILL come later.
SIGNAL_EXIT_LIMIT_S = 4.0


def main(args=None) -> int:
    # Until the node exists, SIGINT / SIGTERM end the process at once (the default action): there is nothing to
    # shut down in order yet, and a start-up stuck inside rclpy (Fast DDS waiting on a file planted in /dev/shm)
    # runs no Python signal handler. From then on they only ask the loop to stop: shutdown runs in order
    # (replan worker, services, node, context) and exits 0, even mid-configure or mid-replan, within
    # SIGNAL_EXIT_LIMIT_S (else exit 1 with every thread's stack).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    stop = threading.Event()
    exit_by: list[float] = []  # when a signal came: the process ends by exit_by[0]

    def on_signal(*_):
        stop.set()
        if not exit_by:  # a C-level watchdog: it fires even while this thread is stuck in a call
            exit_by.append(time.monotonic() + SIGNAL_EXIT_LIMIT_S)
            faulthandler.dump_traceback_later(SIGNAL_EXIT_LIMIT_S, exit=True)

    if hasattr(signal, "SIGUSR1"):  # kill -USR1: every thread's stack to stderr, the node runs on (a hung node)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    # before rclpy.init: the participant takes its id, and Fast DDS reads its profile, when it starts
    port_formula = default_fast_dds_ports()  # else the ids cannot be told from the ports
    held_ids = hold_dead_participant_ids() if port_formula else HeldIds(0)
    planted = planted_port_files(held_ids.domain_id) if port_formula else []
    if planted:
        held_ids.release()
        print(f"flashrt: cannot start: {', '.join(planted)} named as Fast DDS shared-memory port files of domain "
              f"{held_ids.domain_id} but not regular files (planted?): Fast DDS would wait on them for good; remove "
              "them", file=sys.stderr)
        return 2
    dds_line = use_shipped_profile()
    try:
        _init_ros(args if args is not None else sys.argv)
    except Exception as e:  # noqa: BLE001 - e.g. a params file that is missing or not valid YAML
        held_ids.release()
        print(f"flashrt: cannot start: {_one_line(e)}", file=sys.stderr)
        return 2
    code = 0
    node = executor = None
    try:
        node = FlashRTNode(argv=args if args is not None else sys.argv)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        held_ids.release()  # the participant exists
        node.get_logger().info(dds_line)
        participant_line = held_ids.line(own_participant_ids(held_ids.domain_id) if port_formula else [])
        if participant_line:
            node.get_logger().info(participant_line)
        if check_node_param("keep_freed_memory", node.get_parameter("keep_freed_memory").value):
            node.get_logger().info(keep_freed_memory())  # before configure's large allocations
        skipped = list(held_ids.skipped)
        if check_node_param("clean_dead_shm_segments", node.get_parameter("clean_dead_shm_segments").value):
            removed_line = removal_line(*remove_dead_segments(skipped=skipped))
            if removed_line:
                node.get_logger().info(removed_line)
        if skipped:
            node.get_logger().warning(skipped_line(skipped))
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
            # this thread spins the executor, so it steps the observations: it gets thread_priority
            apply_thread_priority(check_node_param("thread_priority", node.get_parameter("thread_priority").value),
                                  node.get_logger())
            spin_until_stopped(executor, node, stop)
    except Exception as e:  # noqa: BLE001 - start-up errors: one line, not a traceback
        print(f"flashrt: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        code = 1
    finally:
        held_ids.release()
        if node is not None:
            node.release()  # the replan worker stops while the context still works
        # C-level: covers interpreter exit too; never later than a signal's limit
        limit = TEARDOWN_LIMIT_S if not exit_by else max(0.1, exit_by[0] - time.monotonic())
        faulthandler.dump_traceback_later(limit, exit=True)
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
