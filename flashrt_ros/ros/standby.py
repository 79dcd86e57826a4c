"""The standby role (issue 18, point 3): a replica that also hears the robot's observations and takes over
when the primary's process stops.

Before: it rebuilds the store from the stream as a replica does, and buffers the observations whose stamps
are newer than its newest record (the primary stepped them, or was about to, after that capsule).
When the primary's liveliness lapses (automatic liveliness on its capsule stream, lease
``liveliness_lease_ms``) and no record came for QUIET_LEASES leases, the node takes over (node.py): it
restores its newest capsule, claims the next epoch on flashrt_leader, steps the buffered observations in order and
publishes from then on. Its policy_step numbering continues the primary's, so a consumer drops duplicates
by step. Byte-identity with a primary that never crashed holds for a timeline that only stepped after the
newest record (a rollback or a commit the stream had not delivered is not known to the standby), and needs
stamped observations (header.stamp set by the sensor, unique and increasing).
"""
from __future__ import annotations

import collections
import time

from .capsule_stream import stream_qos
from .convert import stamp_to_ns
from .replica import ReplicaLink

try:  # rclpy >= Iron
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

BUFFER_MAX = 2000  # observations held (20 s at 100 Hz): far more than a lease's worth
# A lapse alone is not death: a primary stalled for about one lease (a loaded machine) lapses too. The
# standby takes over once its records have also stopped for this many leases (a killed primary's stop at
# once, so failover takes about this many leases).
QUIET_LEASES = 1.5
# Quiet time counts only while this process itself ran: a stall of the whole machine (a VM descheduled by its
# host) freezes the primary and the standby alike, and on resuming the primary looks lapsed and quiet. A timer
# ticks every STALL_TICK_S; a gap between ticks beyond 2 ticks is time this process stood still.
STALL_TICK_S = 0.02


class StandbyLink(ReplicaLink):
    def __init__(self, node, session, primary: str, lease_ms: float, on_primary_lost):
        self.lease_s = lease_ms / 1e3
        self.on_primary_lost = on_primary_lost
        self.buffer: collections.deque = collections.deque(maxlen=BUFFER_MAX)  # (stamp_ns, message)
        self.overflowed = 0  # observations pushed out of a full buffer (a stalled stream)
        self._alive_seen = self._lapsed = False
        self._recheck = None  # a one-shot timer: the lapse looked at again
        self._record_at = time.monotonic()
        self.lost_at = 0.0  # monotonic time the lapse was noticed (0: not yet)
        self._ticks: collections.deque = collections.deque([time.monotonic()], maxlen=64)  # this process ran then
        super().__init__(node, session, primary, stream_qos(lease_ms),
                         SubscriptionEventCallbacks(liveliness=self._on_liveliness))
        self._ticker = node.create_timer(STALL_TICK_S, lambda: self._ticks.append(time.monotonic()))

    def _on_record(self, msg) -> None:
        self._record_at = time.monotonic()
        super()._on_record(msg)
        last = self.replica.last
        while self.buffer and last is not None and self.buffer[0][0] <= last.stamp_ns:
            self.buffer.popleft()  # stepped by the primary before its newest record reached us

    def hold(self, msg) -> None:
        """An observation while the primary leads (executor thread)."""
        header = getattr(msg, "header", None)
        stamp = stamp_to_ns(header.stamp) if header is not None else 0
        if len(self.buffer) == self.buffer.maxlen:
            self.overflowed += 1
        self.buffer.append((stamp, msg))

    def pending(self) -> list:
        """The observations after the newest record, oldest first."""
        last = self.replica.last
        after = last.stamp_ns if last is not None else -1
        return [msg for stamp, msg in self.buffer if stamp > after]

    def _on_liveliness(self, info) -> None:
        if info.alive_count > 0:
            if self.lost_at:  # back after a lapse the node did not act on (nothing held yet): watch again
                self.node.get_logger().info(f"{self.primary}: alive again; standing by")
                self.lost_at = 0.0
            self._alive_seen, self._lapsed = True, False
            return
        if self._alive_seen:
            self._lapsed = True
            self._check_lapse()

    def _check_lapse(self) -> None:
        if not self._lapsed or self.lost_at:
            return
        now = time.monotonic()
        stalled_s = self.stalled_s(self._record_at, now)
        quiet_s = now - self._record_at - stalled_s
        if quiet_s < QUIET_LEASES * self.lease_s:  # records came lately: look again when they should have
            if self._recheck is None:  # one at a time (a timer repeats: a second one would leak)
                self._recheck = self.node.create_timer(QUIET_LEASES * self.lease_s - quiet_s, self._recheck_once)
            return
        self.lost_at = time.monotonic()
        still = f" (and {stalled_s * 1e3:.0f} ms this node stood still)" if stalled_s else ""
        self.node.get_logger().warning(
            f"{self.primary}: liveliness lapsed, no record for {quiet_s * 1e3:.0f} ms{still}")
        self.on_primary_lost(self)

    def stalled_s(self, since: float, now: float) -> float:
        """Seconds of [since, now] this process stood still: gaps between its ticks beyond two tick periods."""
        points = [since, *(t for t in self._ticks if t > since), now]
        return sum(max(0.0, b - a - 2 * STALL_TICK_S) for a, b in zip(points, points[1:]))

    def _recheck_once(self) -> None:
        if self._recheck is not None:
            self.node.destroy_timer(self._recheck)
            self._recheck = None
        self._check_lapse()

    def destroy(self) -> None:
        self.node.destroy_timer(self._ticker)
        if self._recheck is not None:
            self.node.destroy_timer(self._recheck)
            self._recheck = None
        super().destroy()
