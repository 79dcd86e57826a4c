"""The `replan` action: goal validation, a worker thread that runs Session.replan, result delivery.

An accepted goal is run on a worker thread, so the executor keeps serving meanwhile: a cancel request
is seen between batched steps, and observations that arrive are held (latest only) instead of blocking.
When the worker is done it calls goal_handle.execute(); the execute callback, back on the executor
thread, only packs the stored result and runs the held observation.
"""
from __future__ import annotations

import math
import queue
import threading
import time

import numpy as np
from rclpy.action import ActionServer, CancelResponse, GoalResponse

from flashrt_interfaces.action import Replan

from ..runtime.errors import CapsuleError
from .convert import replan_observations


class ReplanServer:
    def __init__(self, node):
        self.node = node
        self._queue: queue.Queue = queue.Queue()
        self._results: dict[bytes, Replan.Result] = {}
        self.busy = threading.Event()  # a goal is accepted and not yet delivered
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="flashrt_replan", daemon=True)
        self._worker.start()
        self.server = ActionServer(node, Replan, "replan", execute_callback=self._deliver,
                                   goal_callback=self._on_goal, cancel_callback=lambda _: CancelResponse.ACCEPT,
                                   handle_accepted_callback=self._on_accepted)

    def destroy(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=5.0)  # a replan in flight finishes (it is bounded by its deadline)
        self.server.destroy()

    # ---- executor thread ------------------------------------------------------------------
    def _on_goal(self, goal) -> GoalResponse:
        try:
            self._validate(goal)
        except (ValueError, CapsuleError) as e:
            self.node.get_logger().warning(f"replan goal rejected: {e}")
            self.node.stats.replans_rejected += 1
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _validate(self, goal) -> np.ndarray:
        cfg = self.node.session.cfg
        if not 1 <= goal.branches <= cfg.max_branches:
            raise ValueError(f"branches must be 1..{cfg.max_branches} (max_branches), got {goal.branches}")
        obs = replan_observations(goal.observations, goal.branches, goal.horizon, cfg.obs_dim)
        if not (goal.commit_branch == -1 or 0 <= goal.commit_branch < goal.branches):
            raise ValueError(f"commit_branch must be -1 (what-if) or 0..{goal.branches - 1}, got {goal.commit_branch}")
        if not (math.isfinite(goal.deadline_ms) and goal.deadline_ms >= 0):
            raise ValueError(f"deadline_ms must be >= 0 (0 = node default), got {goal.deadline_ms}")
        if goal.capsule_id:
            self.node.session.capsule_info(goal.capsule_id)
        return obs

    def _on_accepted(self, goal_handle) -> None:
        self.busy.set()
        self._queue.put(goal_handle)

    def _deliver(self, goal_handle) -> Replan.Result:
        result = self._results.pop(bytes(goal_handle.goal_id.uuid), None)
        if result is None:  # cancelled before the worker ran it
            result = Replan.Result(success=False, message="cancelled before it ran",
                                   live_capsule_id=self.node.session.live_capsule_id)
        if goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif result.success:
            goal_handle.succeed()
        else:
            goal_handle.abort()
        if self._queue.empty() and not self._results:
            self.busy.clear()
            self.node.run_held_observation()
        return result

    # ---- worker thread --------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            goal_handle = self._queue.get()
            if goal_handle is None or self._closed:
                return
            try:
                self._results[bytes(goal_handle.goal_id.uuid)] = self._run(goal_handle)
            except Exception as e:  # noqa: BLE001 - never let the worker die; report instead
                self.node.get_logger().error(f"replan failed unexpectedly: {e!r}")
                self._results[bytes(goal_handle.goal_id.uuid)] = Replan.Result(success=False, message=repr(e))
            if not self._closed:  # shutting down: no executor left to deliver to
                goal_handle.execute()

    def _run(self, goal_handle) -> Replan.Result:
        t0 = time.perf_counter()
        goal = goal_handle.request
        session = self.node.session
        if goal_handle.is_cancel_requested:
            return Replan.Result(success=False, message="cancelled before it ran",
                                 live_capsule_id=session.live_capsule_id)
        try:
            obs = self._validate(goal)  # again: the capsule may have been evicted since the goal was accepted
            deadline = goal.deadline_ms or self.node.get_parameter("replan_deadline_ms").value

            def feedback(steps_done: int) -> None:
                # branches run as one batch: all of them finish together, at the last step
                fb = Replan.Feedback(branches_done=goal.branches if steps_done == goal.horizon else 0,
                                     elapsed_ms=(time.perf_counter() - t0) * 1e3)
                goal_handle.publish_feedback(fb)

            res = session.replan(goal.capsule_id or None, obs,
                                 commit_branch=None if goal.commit_branch < 0 else goal.commit_branch,
                                 deadline_ms=float(deadline), cancel=lambda: goal_handle.is_cancel_requested,
                                 on_step=feedback)
        except (ValueError, CapsuleError) as e:
            return Replan.Result(success=False, message=str(e), live_capsule_id=session.live_capsule_id)
        self.node.stats.replans += 1
        self.node.stats.replan_deadline_misses += int(not res.deadline_met)
        return Replan.Result(success=True, message=res.message, actions=res.actions.ravel().tolist(),
                             branch_capsule_ids=res.branch_capsule_ids, elapsed_ms=res.elapsed_ms,
                             deadline_met=res.deadline_met, live_capsule_id=res.live_capsule_id)
