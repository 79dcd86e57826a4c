"""The `replan` action: admission, one worker thread that runs Session.replan, result delivery.

Threads, and why:
- The action server lives on a small helper node (`<node>_replan`, same namespace) spun by its own
  executor thread. Goals and cancels are therefore answered even while the node's main executor
  thread is busy: nothing here ever takes the session lock on that thread.
- The replan itself runs on a worker thread. Between two batched steps it publishes throttled
  feedback and checks whether to stop: a cancel, the node deactivating or shutting down, or the goal's
  client gone from the graph. The executor keeps stepping observations meanwhile: the replan holds the
  runtime lock only for its bookkeeping, not while a batched step computes (runtime/replan.py).
- At most one replan runs. A goal that arrives meanwhile is rejected at the ROS level: that only
  ever means "busy", and each such answer pauses the admission thread briefly, so that clients
  retrying at once cannot turn answering "busy" into the node's main work. Any other refusal (a
  malformed goal, a deadline over the cap, ...) needs its reason, and ROS 2 rejects without one: such
  a goal is accepted and answered at once with ABORTED, rejected=true and the reason in message
  (see Replan.action).
"""
from __future__ import annotations

import math
import queue
import threading
import time

import numpy as np
import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy

from flashrt_interfaces.action import Replan

from ...runtime.errors import CapsuleError
from ..io.convert import replan_observations
from ..platform.realtime import apply_thread_nice

# Deep enough that a burst of goals from several clients is never dropped before it is answered
# (the rclpy default, depth 10, lost 9 of 20 goals sent at once).
ACTION_SERVICE_QOS = QoSProfile(depth=256, reliability=ReliabilityPolicy.RELIABLE)
FEEDBACK_PERIOD_S = 0.02  # at most 50 feedback messages a second, however short the batched step
BUSY_PAUSE_S = 0.005  # bounds what answering "busy" costs: at most 200 answers a second
CLIENT_CHECK_PERIOD_S = 0.05  # graph queries between batched steps, at most this often
BUSY = "busy: another replan is running (at most one runs at a time; send it again when that one is done)"


def check_goal_size(goal, obs_dim: int, max_mb: float) -> None:
    """Refuse a goal larger than replan_max_goal_mb from its sizes alone, before its observations are
    converted (a 179 MB goal cost 666 MB of memory and a 1.76 s gap in the live step)."""
    declared = goal.branches * goal.horizon * obs_dim * 4  # Python ints: no overflow
    sent = len(goal.observations) * 4
    if max(declared, sent) > max_mb * 2**20:
        raise ValueError(f"goal too large: branches x horizon x obs_dim = {goal.branches} x {goal.horizon} x "
                         f"{obs_dim} float32 is {declared / 2**20:.2f} MB ({sent / 2**20:.2f} MB of observations "
                         f"sent), over replan_max_goal_mb {max_mb:g}: send fewer branches or a shorter horizon "
                         "(or start the node with a larger replan_max_goal_mb)")


def close_goal(goal_handle, result: Replan.Result) -> None:
    """The goal's final status, from its result (Replan.action): SUCCEEDED when it ran, also when a cancel came
    after it had finished (the commit happened); CANCELED when a cancel stopped it; ABORTED otherwise, and always
    for a rejected goal, even one whose client cancelled it before the answer (rejected = true means ABORTED)."""
    if result.success:
        goal_handle.succeed()
    elif goal_handle.is_cancel_requested and not result.rejected:
        goal_handle.canceled()
    else:
        goal_handle.abort()


class ReplanServer:
    def __init__(self, node):
        self.node = node
        self._state = threading.Lock()  # guards _current and _closing; never held across a replan step
        self._current = None  # goal handle of the running replan
        self._closing = ""  # set when the server goes away: the reason, for results and refusals
        self._final = False  # destroy's last phase: goals are no longer accepted (ROS-level reject)
        self._deliveries = 0  # answers scheduled (goal_handle.execute) and not delivered yet
        self._results: dict[bytes, Replan.Result] = {}
        self._queue: queue.Queue = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self.helper = rclpy.create_node(f"{node.get_name()}_replan", namespace=node.get_namespace(),
                                        context=node.context, use_global_arguments=False,
                                        start_parameter_services=False)
        self.server = ActionServer(
            self.helper, Replan, "replan", execute_callback=self._deliver, goal_callback=self._on_goal,
            handle_accepted_callback=self._on_accepted, cancel_callback=lambda _: CancelResponse.ACCEPT,
            goal_service_qos_profile=ACTION_SERVICE_QOS, result_service_qos_profile=ACTION_SERVICE_QOS,
            cancel_service_qos_profile=ACTION_SERVICE_QOS,
            # rclpy keeps every finished goal this long for a late get_result (its default: 900 s), and every
            # action client deserialises the status of all of them at each change (replan_result_kept_s)
            result_timeout=float(node.get_parameter("replan_result_kept_s").value))
        self.feedback_topic = f"{self.helper.get_namespace().rstrip('/')}/replan/_action/feedback"
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(self.helper)
        self._spinner = threading.Thread(target=self._spin, name="flashrt_replan_server", daemon=True)
        self._spinner.start()
        self._worker = threading.Thread(target=self._work, name="flashrt_replan", daemon=True)
        self._worker.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - shutdown (SIGINT) ends the spin; nothing to report
            pass

    def destroy(self, reason: str = "the node is deactivating") -> None:
        """Stop the running goal (answered ABORTED, nothing committed) and go away; returns within
        about one batched replan step plus the delivery of the answers already given. Every goal taken
        before the last phase gets its answer; from then on goals are rejected (the server is going).
        The helper executor is stopped before the server is destroyed and before the context can go,
        so no action-server call is ever made on a dead context (SIGINT / SIGTERM exit cleanly)."""
        with self._state:
            self._closing = reason
        self._idle.wait(timeout=5.0)  # the worker sees _closing between two batched steps
        self._queue.put(None)
        self._worker.join(timeout=5.0)
        with self._state:
            self._final = True  # from here no goal is accepted, so no new delivery can be scheduled
        end = time.monotonic() + 5.0
        while self.node.context.ok() and time.monotonic() < end:
            self._flush(end)  # a goal taken just before _final schedules its delivery before this runs
            with self._state:
                if self._deliveries == 0:
                    break
        if self.node.context.ok():
            self._flush(time.monotonic() + 2.0)  # the sending of the last results
        self.executor.shutdown(timeout_sec=5.0)
        self._spinner.join(timeout=5.0)
        self.server.destroy()
        self.helper.destroy_node()

    def _flush(self, until: float) -> None:
        """Wait until the helper executor has run what was queued before, and what that queued: a
        delivery queues the sending of its result as one more task."""
        flushed = threading.Event()
        self.executor.create_task(lambda: self.executor.create_task(flushed.set))
        flushed.wait(timeout=max(0.0, until - time.monotonic()))

    # ---- helper executor thread: admission and delivery ----------------------------------
    def _check(self, goal):
        """The goal as arguments of Session.replan, from the goal alone (no lock: the capsule id is
        checked when the replan starts); ValueError names what is wrong."""
        cfg = self.node.session.cfg
        if not 1 <= goal.branches <= cfg.max_branches:
            raise ValueError(f"branches must be 1..{cfg.max_branches} (max_branches), got {goal.branches}")
        check_goal_size(goal, cfg.obs_dim, float(self.node.get_parameter("replan_max_goal_mb").value))
        obs = replan_observations(goal.observations, goal.branches, goal.horizon, cfg.obs_dim)
        if not (goal.commit_branch == -1 or 0 <= goal.commit_branch < goal.branches):
            raise ValueError(f"commit_branch must be -1 (what-if) or 0..{goal.branches - 1}, got {goal.commit_branch}")
        if not (math.isfinite(goal.deadline_ms) and goal.deadline_ms >= 0):
            raise ValueError(f"deadline_ms must be >= 0 (0 = replan_deadline_ms), got {goal.deadline_ms}")
        deadline = float(goal.deadline_ms or self.node.get_parameter("replan_deadline_ms").value)
        cap = float(self.node.get_parameter("replan_max_deadline_ms").value)
        if deadline > cap:
            raise ValueError(f"deadline_ms {deadline:g} is over replan_max_deadline_ms {cap:g} (the longest the "
                             "node lets one replan run)")
        return (goal.capsule_id or None, obs, None if goal.commit_branch < 0 else goal.commit_branch, deadline)

    def _on_goal(self, goal) -> GoalResponse:
        """A goal while another replan runs is rejected here, at the ROS level: that answer is cheap
        (no goal to track, no status, no result), and it only ever means busy (see Replan.action).
        Every other refusal needs its reason, so it is accepted and answered ABORTED."""
        with self._state:
            if self._final:  # the server is about to go: an accepted goal could no longer be answered
                return GoalResponse.REJECT
            busy = self._current is not None and not self._closing
        if busy:
            self.node.stats.count("replans_rejected")
            self.node.get_logger().warning("replan goal rejected: busy, another replan is running",
                                           throttle_duration_sec=1.0)
            # Back-pressure: clients retrying at once would make answering "busy" the node's main work
            # and starve the live step of CPU; this thread gives the CPU away for a moment instead.
            time.sleep(BUSY_PAUSE_S)
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_accepted(self, goal_handle) -> None:
        try:
            args, reason = self._check(goal_handle.request), ""
        except (ValueError, CapsuleError) as e:
            args, reason = None, str(e)
        with self._state:
            if not reason and self._closing:
                reason = f"{self._closing}: no new replans"
            if not reason:  # decided here, with _current: a deactivate that began during _check sees this goal
                reason = self._refusal_now()
            if not reason and self._current is not None:  # only if goals interleave; _on_goal rejects first
                reason = BUSY
            if not reason:
                self._current = goal_handle
                self._idle.clear()
        if reason:
            goal_handle.request.observations = []  # rclpy keeps the handle replan_result_kept_s: not its payload
            self.node.stats.count("replans_rejected")
            self.node.get_logger().warning(f"replan goal rejected: {reason}", throttle_duration_sec=1.0)
            self._results[bytes(goal_handle.goal_id.uuid)] = Replan.Result(
                success=False, rejected=True, message=f"rejected: {reason}",
                live_capsule_id=self.node.session.live_capsule_id)
            self._schedule_delivery(goal_handle)
            return
        self._queue.put((goal_handle, args))

    def _refusal_now(self) -> str:
        """Why a goal may not start right now, beyond the checks above ('' = it may); under _state."""
        return ""

    def _schedule_delivery(self, goal_handle) -> None:
        """Hand the goal to _deliver (a task of the helper executor), counted until it has run."""
        with self._state:
            self._deliveries += 1
        try:
            goal_handle.execute()
        except Exception:  # noqa: BLE001 - the context went away (shutdown): nobody is left to answer
            self._delivery_done()

    def _delivery_done(self) -> None:
        with self._state:
            if self._deliveries == 0:  # an answer not scheduled by _schedule_delivery: destroy() would wait 5 s
                self.node.get_logger().error("replan: an answer was delivered that was never counted as scheduled")
                return
            self._deliveries -= 1

    def _deliver(self, goal_handle) -> Replan.Result:
        try:
            result = self._results.pop(bytes(goal_handle.goal_id.uuid), None)
            if result is None:
                result = Replan.Result(success=False, message="no result (the node is shutting down)")
            try:
                close_goal(goal_handle, result)
            except Exception:  # noqa: BLE001 - the status could not be published: only when the context is going
                if self.node.context.ok():
                    raise
            return result
        finally:
            self._delivery_done()

    # ---- worker thread --------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            goal_handle, args = item
            try:
                result = self._run(goal_handle, *args)
            except Exception as e:  # noqa: BLE001 - never let the worker die; report instead
                if self.node.context.ok():
                    self.node.get_logger().error(f"replan failed unexpectedly: {e!r}")
                result = Replan.Result(success=False, message=f"failed: {e!r}")
            finally:
                with self._state:
                    self._current = None
            # A commit does not renew policy_step's history (live_state_replaced): that waits up to 0.3 s for
            # the old writer's acknowledgements, and a replan's answer must stay inside its 50 ms budget.
            self._results[bytes(goal_handle.goal_id.uuid)] = result
            if self.node.context.ok():  # after SIGINT there is no executor left to answer with
                self._schedule_delivery(goal_handle)
            self._idle.set()

    def _action_clients(self) -> int:
        """Action clients of 'replan' in the graph (every rclpy/rclcpp action client subscribes to the
        feedback topic); -1 if the graph cannot be read (shutting down: the other checks stop the goal)."""
        try:
            return self.helper.count_subscribers(self.feedback_topic)
        except Exception:  # noqa: BLE001
            return -1

    def _run(self, goal_handle, capsule_id, obs, commit_branch, deadline_ms) -> Replan.Result:
        t0 = time.perf_counter()
        session = self.node.session
        apply_thread_nice(self.node.replan_nice(), self.node.get_logger())  # the value of the last configure
        branches, horizon = obs.shape[:2]
        why_stopped = [""]
        # feedback from FEEDBACK_PERIOD_S in: a shorter replan sends none (its result says it all, and a
        # publish costs about a millisecond of Python, a fifth of a 4 x 8 replan at the default window)
        throttle = {"feedback": time.monotonic(), "client": time.monotonic(), "sent": False}
        # rmw does not say which client sent a goal, so a goal is abandoned once a client was seen and
        # none is left (a dead planner); with other clients alive, replan_max_deadline_ms bounds it.
        client_seen = [self._action_clients() > 0]

        def stop() -> bool:
            if goal_handle.is_cancel_requested:
                return True
            if self._closing or not self.node.context.ok():
                why_stopped[0] = self._closing or "the node is shutting down"
                return True
            now = time.monotonic()
            if now - throttle["client"] >= CLIENT_CHECK_PERIOD_S:
                throttle["client"] = now
                clients = self._action_clients()
                if clients > 0:
                    client_seen[0] = True
                elif clients == 0 and client_seen[0]:
                    why_stopped[0] = "its client is gone (no action client of 'replan' left)"
                    return True
            return False

        def between_steps(done: int) -> None:
            now = time.monotonic()
            due = now - throttle["feedback"] >= FEEDBACK_PERIOD_S or (done == horizon and throttle["sent"])
            if due and not self._closing and self.node.context.ok():
                throttle["feedback"], throttle["sent"] = now, True
                try:
                    goal_handle.publish_feedback(Replan.Feedback(
                        branches_done=branches if done == horizon else 0, steps_done=done,
                        elapsed_ms=(time.perf_counter() - t0) * 1e3))
                except Exception:  # noqa: BLE001 - the context went away meanwhile (SIGINT): nothing to tell
                    pass

        forward = self.node.commit_forwarder() if commit_branch is not None else None
        if forward is not None:  # a replica: a what-if here, then the primary re-runs and commits the branch
            capsule_id, forwarded, commit_branch = capsule_id or session.live_capsule_id, commit_branch, None
            if not capsule_id:  # its row 0 is not the primary's live state: the primary would commit another branch
                return Replan.Result(success=False, rejected=True, live_capsule_id=0, message=(
                    "rejected: this replica holds no capsule of the primary's timeline yet, so a commit has nothing "
                    "to start from: wait until list_capsules shows its stream arriving, or name a capsule"))
            run = forward.replica.timeline  # the primary's run that capsule belongs to (checked again at the forward)
        try:
            res = session.replan(capsule_id, obs, commit_branch=commit_branch, deadline_ms=deadline_ms,
                                 cancel=stop, on_step=between_steps)
        except (ValueError, CapsuleError) as e:  # e.g. the capsule was evicted or never existed
            return Replan.Result(success=False, rejected=True, message=f"rejected: {e}",
                                 live_capsule_id=session.live_capsule_id)
        if forward is not None and not res.cancelled:
            return forward_commit(forward, self.node, capsule_id, run, obs, forwarded, res, deadline_ms)
        message = res.message
        if res.cancelled and why_stopped[0]:
            message = f"stopped: {why_stopped[0]}; {res.message}"
            self.node.get_logger().warning(f"replan {message}")
        elif not res.cancelled:
            self.node.stats.count("replans")
            self.node.stats.count("replan_deadline_misses", int(not res.deadline_met))
        return Replan.Result(success=not res.cancelled, message=message, actions=res.actions.ravel().tolist(),
                             steps_done=res.steps_done, branch_capsule_ids=res.branch_capsule_ids,
                             elapsed_ms=res.elapsed_ms, deadline_met=res.deadline_met,
                             live_capsule_id=res.live_capsule_id)


def forward_commit(link, node, capsule_id: int, run: int, obs, branch: int, res, deadline_ms: float) -> Replan.Result:
    """A replica's committing replan: branch ``branch`` of its what-if ``res`` (the steps it got) re-run by the
    primary from the same capsule, committed there. The result carries this replica's actions of every branch,
    the primary's new live capsule, and whether the primary's bytes matched this replica's."""
    done, primary = res.steps_done, link.primary  # the leader now: a failover may switch the link meanwhile
    base = Replan.Result(actions=res.actions.ravel().tolist(), steps_done=done,
                         branch_capsule_ids=res.branch_capsule_ids, elapsed_ms=res.elapsed_ms,
                         deadline_met=res.deadline_met)
    if done == 0:
        base.success, base.message = False, f"{res.message}; no step ran, nothing to commit on {primary}"
        return base
    try:
        out = link.forward_commit(capsule_id, run, obs[branch, :done], deadline_ms, timeout_s=5.0 + deadline_ms / 1e3)
    except Exception as e:  # noqa: BLE001 - no answer from the primary: the commit did not happen here
        base.success, base.message = False, f"{res.message}; commit of branch {branch} not confirmed by " \
                                            f"{primary}: {e}"
        return base
    if not out.succeeded:
        base.success, base.message = False, (f"{res.message}; {primary} did not commit branch {branch}: "
                                             f"{out.reason or out.result.message}")
        return base
    theirs = np.asarray(out.result.actions, np.float32).tobytes()
    mine = res.actions[branch, :out.result.steps_done].astype(np.float32).tobytes()
    same = "byte-identical to this replica's" if theirs == mine else "DIFFERENT from this replica's (see the log)"
    if theirs != mine:
        node.get_logger().error(f"{primary} re-ran branch {branch} from capsule {capsule_id} with other bytes "
                                "than this replica: the two do not run the same backend or machine type")
    base.success, base.live_capsule_id = True, out.result.live_capsule_id
    base.message = (f"{res.message}; branch {branch} committed on {primary} as capsule "
                    f"{out.result.live_capsule_id} ({out.result.steps_done} steps, {same})")
    return base
