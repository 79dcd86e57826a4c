"""The policy_step writer and its history (io/step_link.py: why it is transient-local).

A writer hands its last steps to every late subscriber. Those must be steps of the live timeline: on a
rollback, a reset, a restoring import and while inactive the writer is replaced by one with an empty history.
The replacement is made ahead (the spare, which never publishes), so the subscribers have matched it when it
takes over: a writer made at the swap would drop, for a subscriber that has not matched it yet, every step
beyond its history depth (a volatile one gets none of them).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rclpy.duration import Duration

from flashrt_interfaces.msg import PolicyStep

POLICY_STEP_ACK_WAIT_S = 0.1  # before a policy_step writer goes: time for subscribers to acknowledge its last steps
POLICY_STEP_RENEW_WAIT_S = 2.0  # a service waits this long for the executor to renew the policy_step writer
# After a rollback or reset the replaced policy_step writer stays (publishing nothing) until its subscribers
# acknowledge its steps, or this long: a writer destroyed while a subscriber has not yet processed its last steps
# takes them with it. Acknowledgements often wait for the rmw's periodic heartbeat (seconds), while delivery
# takes milliseconds, so the bound is the time a subscriber's DDS threads may stay descheduled on a loaded machine.
POLICY_STEP_RETIRE_WAIT_S = 0.3


class PolicyStepLink:
    """The node's policy_step writer and its spare. ``topic`` and ``qos`` are called when a writer is made (the
    robot's topic and the profile of the last configure)."""

    def __init__(self, node, topic: Callable[[], str], qos: Callable[[], object]):
        self.node, self._topic, self._qos = node, topic, qos
        self._writers: dict = {}  # "policy_step", "policy_step_spare"
        self._lock = threading.Lock()  # the writer: publishing vs replacing it
        self._history = False  # the writer has published since it was made

    @property
    def open(self) -> bool:
        return "policy_step" in self._writers

    def publish(self, msg: PolicyStep) -> None:
        with self._lock:
            writer = self._writers.get("policy_step")
            if writer is not None:  # None: deactivated meanwhile
                writer.publish(msg)
                self._history = True

    def renew(self, recreate: bool = True) -> None:
        """Executor thread only (DDS entities are made and destroyed there): a fresh writer and spare, or
        none (recreate=False, inactive). What current subscribers have not yet acknowledged is briefly
        waited for (deactivate: nothing more is stepped)."""
        with self._lock:  # never the runtime lock: not needed to swap a DDS writer
            old = self._writers.pop("policy_step", None)
            spare = self._writers.pop("policy_step_spare", None)
            if old is not None:
                try:
                    old.wait_for_all_acked(Duration(seconds=POLICY_STEP_ACK_WAIT_S))
                except Exception:  # noqa: BLE001 - an rmw without the call: the history goes anyway
                    pass
                self.node.destroy_publisher(old)
            if recreate:
                self._writers["policy_step"] = spare or self._new_writer()
                self._writers["policy_step_spare"] = self._new_writer()
            elif spare is not None:
                self.node.destroy_publisher(spare)
            self._history = False

    def _new_writer(self):
        return self.node.create_publisher(PolicyStep, self._topic(), self._qos())

    def forget_history(self) -> None:
        """The live state no longer continues the steps published so far (rollback, reset, a restoring
        import): start policy_step's history afresh. Called from a service worker thread, never the
        executor.

        The spare takes the next steps; the old writer, publishing nothing more, stays until its subscribers
        have acknowledged what it sent, or POLICY_STEP_RETIRE_WAIT_S. Both waits poll from here: rmw's
        blocking wait holds the GIL, and would stop the executor stepping. Returns once the old writer is
        gone, so a subscriber that joins after the answer gets no step of the timeline that was left."""
        with self._lock:
            if not self._history:  # nothing to forget (rollbacks back to back cost nothing here)
                return
        if self.node.executor is None:
            self.renew("policy_step" in self._writers)
            return
        _poll_until(self._spare_matched, POLICY_STEP_RENEW_WAIT_S)  # a spare made by the last swap
        retired = self._on_executor(self._swap_writer, self._destroy_retired_writer)
        if retired is None:
            return
        _poll_until(lambda: _all_acked(retired), POLICY_STEP_RETIRE_WAIT_S)
        self._on_executor(lambda: self._destroy_retired_writer(retired), None)

    def _spare_matched(self) -> bool:
        """The spare has matched as many subscribers as the live writer (or the node is no longer active)."""
        try:
            live, spare = self._writers.get("policy_step"), self._writers.get("policy_step_spare")
            return live is None or spare is None or spare.get_subscription_count() >= live.get_subscription_count()
        except Exception:  # noqa: BLE001 - destroyed meanwhile (deactivate): nothing to wait for
            return True

    def _swap_writer(self):
        """Executor thread: the spare becomes the writer, a new spare is made; returns the replaced writer
        (None while inactive)."""
        with self._lock:
            old = self._writers.get("policy_step")
            if old is not None:
                self._writers["policy_step"] = self._writers.pop("policy_step_spare", None) or self._new_writer()
                self._writers["policy_step_spare"] = self._new_writer()
            self._history = False
        return old

    def _destroy_retired_writer(self, writer) -> None:
        if writer is not None:
            self.node.destroy_publisher(writer)

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
            self.node.executor.create_task(task)
        except Exception:  # noqa: BLE001 - the executor is shutting down: the writers go with the node
            return None
        ran.wait(POLICY_STEP_RENEW_WAIT_S)
        with lock:
            state["waiting"] = False
            if not ran.is_set():
                self.node.get_logger().warning("policy_step history not renewed in time: a late subscriber may "
                                               "still get steps from before the rollback or reset")
            return state["result"]

    def destroy(self) -> None:
        """Cleanup: every writer goes (the node is no longer configured)."""
        with self._lock:
            for writer in self._writers.values():
                self.node.destroy_publisher(writer)
            self._writers = {}


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


