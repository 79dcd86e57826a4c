"""FlashRTClient: what a planner uses to talk to a flashrt node (services + the Replan action).

Blocking calls with timeouts on top of a plain rclpy Node; the caller owns the node and its context.
Used by the demo's planner, the ROS benchmark and the tests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import rclpy
from rclpy.action import ActionClient
from std_srvs.srv import Trigger

from flashrt_interfaces.action import Replan
from flashrt_interfaces.srv import DropCapsule, ExportCapsule, ImportCapsule, ListCapsules, Rollback, Snapshot

SERVICES = {"snapshot": Snapshot, "rollback": Rollback, "list_capsules": ListCapsules,
            "drop_capsule": DropCapsule, "export_capsule": ExportCapsule, "import_capsule": ImportCapsule,
            "reset": Trigger}


class FlashRTTimeout(TimeoutError):
    pass


@dataclass
class ReplanOutcome:
    accepted: bool
    status: int  # action_msgs/GoalStatus
    result: Replan.Result | None
    feedback: list
    rtt_ms: float

    def actions(self, branches: int, action_dim: int) -> np.ndarray:
        return np.asarray(self.result.actions, np.float32).reshape(branches, -1, action_dim)


class FlashRTClient:
    def __init__(self, node, namespace: str = ""):
        self.node = node
        ns = namespace.rstrip("/")
        self.clients = {name: node.create_client(t, f"{ns}/{name}" if ns else name) for name, t in SERVICES.items()}
        self.replan_client = ActionClient(node, Replan, f"{ns}/replan" if ns else "replan")

    def wait_until_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        for c in self.clients.values():
            if not c.wait_for_service(timeout_sec=max(0.0, deadline - time.monotonic())):
                raise FlashRTTimeout(f"service '{c.srv_name}' not available after {timeout_s} s")
        if not self.replan_client.wait_for_server(timeout_sec=max(0.1, deadline - time.monotonic())):
            raise FlashRTTimeout(f"action 'replan' not available after {timeout_s} s")

    def _spin_until(self, future, timeout_s: float):
        rclpy.spin_until_future_complete(self.node, future, timeout_sec=timeout_s)
        if not future.done():
            raise FlashRTTimeout(f"no answer within {timeout_s} s")
        return future.result()

    def call(self, name: str, timeout_s: float = 5.0, **fields):
        return self._spin_until(self.clients[name].call_async(SERVICES[name].Request(**fields)), timeout_s)

    def rollback(self, capsule_id: int = 0, steps_back: int = 0, timeout_s: float = 5.0) -> Rollback.Response:
        return self.call("rollback", timeout_s, capsule_id=capsule_id, steps_back=steps_back)

    def snapshot(self, label: str = "", pin: bool = False, timeout_s: float = 5.0) -> Snapshot.Response:
        return self.call("snapshot", timeout_s, label=label, pin=pin)

    def replan(self, observations: np.ndarray, capsule_id: int = 0, commit_branch: int = -1,
               deadline_ms: float = 0.0, cancel_after_feedback: int | None = None,
               timeout_s: float = 10.0) -> ReplanOutcome:
        """observations: [branches, horizon, obs_dim]. Blocks until the result (or raises on timeout)."""
        obs = np.asarray(observations, np.float32)
        branches, horizon = (obs.shape[0], obs.shape[1]) if obs.ndim == 3 else (0, 0)
        goal = Replan.Goal(capsule_id=capsule_id, branches=branches, horizon=horizon,
                           observations=obs.ravel().tolist(), commit_branch=commit_branch, deadline_ms=deadline_ms)
        return self.send_goal(goal, cancel_after_feedback, timeout_s)

    def send_goal(self, goal: Replan.Goal, cancel_after_feedback: int | None = None,
                  timeout_s: float = 10.0) -> ReplanOutcome:
        feedback: list = []
        state = {"cancelled": False}
        handle_box = {}

        def on_feedback(msg):
            feedback.append(msg.feedback)
            if cancel_after_feedback is not None and len(feedback) >= cancel_after_feedback and not state["cancelled"]:
                state["cancelled"] = True
                handle_box["h"].cancel_goal_async()

        t0 = time.perf_counter()
        handle = self._spin_until(self.replan_client.send_goal_async(goal, feedback_callback=on_feedback), timeout_s)
        if not handle.accepted:
            return ReplanOutcome(False, 0, None, feedback, (time.perf_counter() - t0) * 1e3)
        handle_box["h"] = handle
        res = self._spin_until(handle.get_result_async(), timeout_s)
        return ReplanOutcome(True, res.status, res.result, feedback, (time.perf_counter() - t0) * 1e3)
