"""A Replan goal in flight (ReplanTask) and its answer (ReplanOutcome), as FlashRTClient hands them out."""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import rclpy
from action_msgs.msg import GoalStatus
from unique_identifier_msgs.msg import UUID

from flashrt_interfaces.action import Replan

BUSY = "rejected: busy: another replan is running (at most one runs at a time; send it again when that one is done)"


class FlashRTTimeout(TimeoutError):
    """No answer: the node (or the service / action) is not there, or did not reply in time."""


@dataclass
class ReplanOutcome:
    accepted: bool  # False: refused before running (reason says why); nothing ran, nothing changed
    reason: str  # why it was refused, '' when accepted
    status: int  # action_msgs/GoalStatus
    result: Replan.Result  # always a Result; for a refusal success=False, rejected=True
    branches: int
    feedback: list = field(default_factory=list)
    rtt_ms: float = 0.0  # send to result, on this process's clock
    accepted_ms: float = 0.0  # send to the goal response (the first of the action's two round trips)

    @property
    def succeeded(self) -> bool:
        return self.status == GoalStatus.STATUS_SUCCEEDED and self.result.success

    @property
    def cancelled(self) -> bool:
        return self.status == GoalStatus.STATUS_CANCELED

    def actions(self, branches: int | None = None, action_dim: int | None = None) -> np.ndarray:
        """[branches, steps_done, action_dim] float32 (steps_done < horizon for a partial result).
        branches / action_dim, if given, are checked against the answer."""
        flat = np.asarray(self.result.actions, np.float32)
        steps = int(self.result.steps_done)
        if steps == 0 or self.branches == 0:
            return flat.reshape(self.branches, 0, action_dim or 0)
        out = flat.reshape(self.branches, steps, -1)
        if branches not in (None, out.shape[0]) or action_dim not in (None, out.shape[2]):
            raise ValueError(f"actions are {out.shape}, not [{branches}, steps, {action_dim}]")
        return out


class ReplanTask:
    """A Replan goal in flight; never blocks unless asked to (get_result)."""

    def __init__(self, client, goal: Replan.Goal, feedback_callback=None):  # client: the FlashRTClient sending it
        self._client = client
        self.goal = goal
        self.feedback: list = []
        self._user_feedback = feedback_callback
        self._t0 = time.perf_counter()
        self._accepted_ms = 0.0
        self._result_future = None
        self._outcome: ReplanOutcome | None = None
        self._done = threading.Event()
        # the goal's id, ours: rclpy drops a goal's feedback callback only once its result came, so a refused or
        # given-up goal's (and this task, its observations) stayed in the client for good; we drop it by this id
        self._goal_key = uuid.uuid4().bytes
        self._send_future = client.replan_client.send_goal_async(goal, feedback_callback=self._on_feedback,
                                                                 goal_uuid=UUID(uuid=list(self._goal_key)))
        self._send_future.add_done_callback(self._on_goal_response)

    def _on_feedback(self, msg) -> None:
        self.feedback.append(msg.feedback)
        if self._user_feedback is not None:
            self._user_feedback(msg.feedback)

    def _on_goal_response(self, future) -> None:
        if future.cancelled():  # the caller gave up waiting (FlashRTTimeout): no answer to record
            forget_feedback(self._client.replan_client, self._goal_key)
            return
        self._accepted_ms = (time.perf_counter() - self._t0) * 1e3
        handle = future.result()
        if handle is None or not handle.accepted:  # the ROS-level rejection only ever means busy (Replan.action)
            forget_feedback(self._client.replan_client, self._goal_key)
            self._finish(GoalStatus.STATUS_UNKNOWN, Replan.Result(success=False, rejected=True, message=BUSY))
            return
        self._result_future = handle.get_result_async()
        self._result_future.add_done_callback(self._on_result)

    def _on_result(self, future) -> None:
        if future.cancelled():
            return
        status, result = future.result().status, future.result().result
        if status == GoalStatus.STATUS_UNKNOWN and not result.message:  # the server no longer holds the goal
            result.message = ("no result: the node no longer holds this goal (its result was kept "
                              "replan_result_kept_s after it finished, and asked for later)")
        self._finish(status, result)

    def _finish(self, status: int, result: Replan.Result) -> None:
        reason = result.message if result.rejected else ""
        self._outcome = ReplanOutcome(not result.rejected, reason, status, result, int(self.goal.branches),
                                      self.feedback, (time.perf_counter() - self._t0) * 1e3, self._accepted_ms)
        self._done.set()

    def is_task_complete(self) -> bool:
        """True once the answer is in (spins the node once, without waiting, if nobody else does)."""
        if not self._done.is_set() and not self._client.spun_elsewhere():
            rclpy.spin_once(self._client.node, timeout_sec=0.0)
        return self._done.is_set()

    def get_result(self, timeout_s: float = 10.0) -> ReplanOutcome:
        """Wait for the answer; FlashRTTimeout if it does not come within timeout_s. A timed-out task is
        given up: its requests still waiting for the node are cancelled here (the node is not told; call
        cancel() first to stop a goal that runs)."""
        try:
            self._client.wait_for(self._done, timeout_s, "the replan result")
        except FlashRTTimeout:
            for future in (self._send_future, self._result_future):
                if future is not None and not future.done():
                    future.cancel()
            raise
        return self._outcome

    def cancel(self, timeout_s: float = 5.0) -> bool:
        """Ask the node to stop the goal after its current batched step (it then never commits).
        Returns whether the node took the request; False if the goal had already ended or was refused."""
        # not given up on a timeout: the goal may still be accepted, run and commit; get_result() sees it
        handle = self._client.wait_for(self._send_future, timeout_s, "the goal response", give_up=False)
        if handle is None or not handle.accepted or self._done.is_set():
            return False
        response = self._client.wait_for(handle.cancel_goal_async(), timeout_s, "the cancel response")
        return len(response.goals_canceling) > 0


def forget_feedback(action_client, goal_key: bytes) -> None:
    """Drop a goal's feedback callback (rclpy drops it only with a result, which a refused goal never gets)."""
    getattr(action_client, "_feedback_callbacks", {}).pop(goal_key, None)
