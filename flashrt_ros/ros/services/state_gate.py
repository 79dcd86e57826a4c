"""Services and the replan action in every lifecycle state, as nav2 servers behave; and the replica role's
refusals (group/replica.py) of the services that would change the robot's state.

They are created once, with the node, and live as long as it does: a caller never sees them vanish or
waits on a service that is gone. While the node is not active every call and goal is answered at once
with a refusal that names the state, and nothing is touched. The gate sits here, around the handlers of
capsules.py and replan.py, so those stay about the work itself.
"""
from __future__ import annotations

from flashrt_interfaces.action import Replan

from .capsules import CapsuleServices
from .replan import ReplanServer

PAUSE_WAIT_S = 5.0  # deactivate waits this long for a running replan to stop (one batched step, normally)


def inactive_refusal(state: str) -> str:
    """The answer of a call or goal while the node is in `state` (not active)."""
    if state == "unconfigured":
        return "flashrt is unconfigured: configure and activate it first (ros2 lifecycle set <node> configure)"
    if state == "finalized":
        return "flashrt is finalized (shut down): restart the node"
    return f"flashrt is {state}: activate it first (ros2 lifecycle set <node> activate)"


try:  # capsules.py's refusal type where it has one: answered "<service> refused: ...", logged as a warning
    from .capsules import NotServing as _Refusal
except ImportError:
    _Refusal = ValueError


class NodeInactive(_Refusal):
    """Raised by a call taken while the node was active that finds it no longer active when its turn comes
    (queued behind a call waiting for a replan, then the node deactivated): refused, nothing run."""


def deactivated_refusal(state: str) -> str:
    return (f"the node is deactivating (now {state}): a call taken while it was active and not run yet is "
            "refused; call again once it is active")


class GatedCapsuleServices(CapsuleServices):
    """CapsuleServices that refuse every call while the node is not active: on arrival, on the executor
    thread (an answer at once, never queued), and again when a queued call's turn comes."""

    def _off_executor(self, name: str, work):
        def gated_work(request, response):
            if self.node.inactive_refusal():
                raise NodeInactive(deactivated_refusal(self.node.lifecycle_state()))
            work(request, response)

        inner = super()._off_executor(name, gated_work)

        async def callback(request, response):
            refusal = self.node.inactive_refusal() or self.node.role_refusal(name)
            if refusal:
                response.success, response.message = False, f"{name} refused: {refusal}"
                self.node.get_logger().warning(response.message, throttle_duration_sec=1.0)
                return response
            return await inner(request, response)

        return callback


class GatedReplanServer(ReplanServer):
    """ReplanServer that answers a goal while the node is not active at once: ABORTED, rejected=true,
    the state in message. On deactivate the running replan is stopped (nothing committed, as before);
    the server itself stays."""

    def _on_accepted(self, goal_handle) -> None:
        refusal = self.node.inactive_refusal()
        if not refusal:
            super()._on_accepted(goal_handle)
            return
        session = self.node.session
        self.node.stats.count("replans_rejected")
        self.node.get_logger().warning(f"replan goal refused: {refusal}", throttle_duration_sec=1.0)
        self._results[bytes(goal_handle.goal_id.uuid)] = Replan.Result(
            success=False, rejected=True, message=f"rejected: {refusal}",
            live_capsule_id=session.live_capsule_id if session is not None else 0)
        self._schedule_delivery(goal_handle)  # counted, so destroy() knows when every answer went out

    def _refusal_now(self) -> str:
        # again at the moment the goal would start: a deactivate may have begun while its goal was checked
        return self.node.inactive_refusal()

    def stop_running(self, reason: str) -> bool:
        """Stop the running replan, if any (answered ABORTED with `reason`); True once none runs."""
        with self._state:
            self._closing = reason
        try:
            return self._idle.wait(timeout=PAUSE_WAIT_S)
        finally:
            with self._state:
                if self._closing == reason:
                    self._closing = ""

