"""How an observation becomes a step: the message read and checked (io/convert.py), its stamp checked against
the node's clock, one Session.step, the action and trajectory out (io/outputs.py), then the step's PolicyStep
(io/policy_step.py). A refused observation leaves the state untouched and is counted (io/stats.py).
"""
from __future__ import annotations

from collections.abc import Callable

from std_msgs.msg import Header

from flashrt_interfaces.msg import PolicyStep

from ..runtime.errors import CapsuleError, NonFiniteAction
from ..runtime.inputs import check_stamp_ns
from .io.convert import JointNamesMismatch, ObservationReader, stamp_to_ns
from .io.outputs import ActionOutputs
from .io.policy_step import PolicyStepLink
from .io.stats import NodeStats


class Stepper:
    """One configured session's stepping, from configure to cleanup. ``deadline_ms`` is read at each step
    (step_deadline_ms is a live parameter)."""

    def __init__(self, session, reader: ObservationReader, outputs: ActionOutputs, policy_step: PolicyStepLink,
                 stats: NodeStats, logger, clock, max_future_stamp_ms: float, deadline_ms: Callable[[], float],
                 last_stamp_ns: int = 0, fenced: Callable[..., None] = lambda publish, *args: publish(*args)):
        """``fenced(publish, *args)``: every output goes through it (the lease: group/roles.py)."""
        self.session, self.reader, self.outputs, self.policy_step = session, reader, outputs, policy_step
        self.stats, self.logger, self.clock = stats, logger, clock
        self.max_future_stamp_ms, self.deadline_ms = max_future_stamp_ms, deadline_ms
        self.last_stamp_ns = last_stamp_ns  # a snapshot's stamp
        self.fenced = fenced

    def step_from_message(self, msg) -> None:
        session, reader = self.session, self.reader
        try:
            obs = reader(msg)
        except JointNamesMismatch as e:  # another publisher, or a wrong joint_names: an error on /diagnostics
            self.stats.joint_name_mismatch(str(e))
            self.logger.error(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        except ValueError as e:  # counted; the state is untouched
            self.stats.count("rejected")
            self.logger.warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        header = getattr(msg, "header", None)
        stamp = header.stamp if header is not None else None
        now = self.clock.now()
        if stamp is None or (stamp.sec == 0 and stamp.nanosec == 0):  # none (a float array) or never set
            stamp = now.to_msg()
            self.stats.count("stamps_from_clock")
        try:  # a stamp before 1970 would make capsules no file or record can carry; the state is untouched
            stamp_ns = check_stamp_ns(stamp_to_ns(stamp))
        except ValueError as e:
            self.stats.count("rejected")
            self.logger.warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        ahead_ms = (stamp_ns - now.nanoseconds) / 1e6
        # a wrong clock: refused, the state untouched (a sim clock still at 0, before /clock: nothing to compare)
        if now.nanoseconds > 0 and ahead_ms > self.max_future_stamp_ms:
            self.stats.count("rejected")
            self.stats.count("stamps_in_future")
            self.logger.warning(f"observation rejected: stamped {ahead_ms:.0f} ms ahead of this node's clock "
                                f"(max_future_stamp_ms {self.max_future_stamp_ms:g}): the sensor's clock is wrong, "
                                "or not synchronised with this computer's", throttle_duration_sec=1.0)
            return
        self.last_stamp_ns = stamp_ns

        def publish_action(action, publish=self.outputs.publish_action):
            self.fenced(publish, action)

        # the step and its policy_step as one: a rollback comes before both or after both, so a renewed
        # history never starts with a step of the timeline that was left
        with session.lock:
            self._step_and_publish(session, obs, stamp, header, publish_action)

    def _step_and_publish(self, session, obs, stamp, header, publish_action) -> None:
        try:
            res = session.step(obs, self.last_stamp_ns, on_action=publish_action)
        except NonFiniteAction as e:  # nothing went out; the state is as before this step
            self.stats.step_refused(str(e))
            self.logger.error(str(e), throttle_duration_sec=1.0)
            return
        except CapsuleError as e:  # the step ran and the action went out; only the capsule is missing
            self.stats.count("capsule_errors")
            self.logger.error(f"no capsule for this step: {e}", throttle_duration_sec=1.0)
            return
        except ValueError as e:  # refused before it ran: the state is untouched
            self.stats.count("rejected")
            self.logger.warning(f"observation rejected: {e}", throttle_duration_sec=1.0)
            return
        missed = res.latency_ms > self.deadline_ms()
        self.stats.add_step(res.latency_ms, missed)
        if missed:
            self.logger.warning(f"step took {res.latency_ms:.2f} ms", throttle_duration_sec=1.0)
        msg = PolicyStep(
            header=Header(stamp=stamp, frame_id=header.frame_id if header is not None else ""),
            step=res.step, capsule_id=res.capsule_id, action=res.action.tolist(),
            action_chunk=res.chunk.ravel().tolist(), chunk_len=session.cfg.chunk_len,
            step_latency_ms=res.latency_ms, epoch=self.outputs.epoch)
        self.fenced(self.outputs.publish_trajectory, msg.header, res.chunk)
        self.fenced(self.policy_step.publish, msg)

