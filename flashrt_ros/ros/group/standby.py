"""The standby role (issue 18, point 3): a replica that also hears the robot's observations and takes over
when the primary's process stops.

Before: it rebuilds the store from the stream as a replica does, and buffers the observations whose stamps
are newer than its newest record (the primary stepped them, or was about to, after that capsule).
When the primary's liveliness lapses (automatic liveliness on its capsule stream, lease
``liveliness_lease_ms``) and it had an observation to step but published no record for QUIET_LEASES leases
(or, with nothing to step, the lapse lasts IDLE_LEASES leases), the node takes over (roles.py): it
restores its newest capsule, claims the next epoch on flashrt_leader, steps the buffered observations in order and
publishes from then on. Its policy_step numbering continues the primary's, so a consumer drops duplicates
by step. Byte-identity with a primary that never crashed holds for a timeline that only stepped after the
newest record (a rollback or a commit the stream had not delivered is not known to the standby), and needs
stamped observations (header.stamp set by the sensor, unique and increasing).

It follows whoever leads the robot (LeaderWatch, as a replica does): after another standby took over, the new
leader's stream and liveliness are the ones watched, its silence counting as a lapse until it is seen alive,
and a takeover before its first keyframe continues from the capsule its claim names (StreamReplica.newest).
``standby_takeover_delay_ms`` lets a second standby leave the takeover to the first.

The lease (issue 44, docs/leadership.md): whatever the rule above says, the standby takes over only once
``lease + margin`` (LEASE_MARGIN) of its own running time has passed since the last heartbeat of the followed
leader arrived (group/leader.py): by then that leader has stopped publishing for 2 margins.
"""
from __future__ import annotations

import time

from ..io.convert import stamp_to_ns
from .held_observations import HeldObservations
from .leader import LEASE_MARGIN
from .replica import ReplicaLink
from .stall_clock import STALL_TICK_S, StallClock
from .stream import stream_qos

try:  # rclpy >= Iron
    from rclpy.event_handler import SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks

# A lapse alone is not death: a primary stalled for about one lease (a loaded machine) lapses too. The
# standby takes over once the primary, with an observation to step, has also published no record for this many
# leases (a killed primary's records stop at once, so failover takes about this many leases).
QUIET_LEASES = 1.5
# With nothing to step a primary publishes no records, so their silence says nothing: then the lapse itself
# must last this many leases (a starved but living primary asserts its liveliness again well before).
IDLE_LEASES = 5.0
# The leader's heartbeats (group/lease.py) silent this long, while the stream's DDS liveliness holds (an idle writer
# of someone else's on the stream topic keeps it alive), count as a lapse: longer than IDLE_LEASES, as a margin
# for a loaded machine (heartbeats come from a thread of their own, not the leader's busy executor).
HEARTBEAT_LAPSE_LEASES = 10.0
# Quiet time counts only while this process itself ran: a stall of the whole machine (a VM descheduled by its
# host) freezes the primary and the standby alike, and on resuming the primary looks lapsed and quiet. A timer
# ticks every STALL_TICK_S; a gap between ticks beyond 2 ticks is time this process stood still. Such a stall
# from IDLE_LEASES before the lapse on also adds its length to the patience: on resuming, a loaded machine
# may give the primary the CPU well after the standby.


class StandbyLink(ReplicaLink):
    def __init__(self, node, session, primary: str, lease_ms: float, on_primary_lost, takeover_delay_ms: float = 0.0,
                 thread_safe_actions: bool = True, heard_at=lambda node: -float("inf")):
        """``heard_at(node)``: when the newest heartbeat of ``node``'s lease arrived (LeaderGuard.heard_at)."""
        self.lease_s = lease_ms / 1e3
        self.heard_at = heard_at
        self.delay_s = takeover_delay_ms / 1e3  # on top of the rule: a second standby lets the first take over
        self.on_primary_lost = on_primary_lost
        self.buffer = HeldObservations()
        self._alive_seen = self._lapsed = False
        self._unconfirmed = False  # following a new leader not yet seen alive: its silence counts as a lapse
        self._recheck = None  # a one-shot timer: the lapse looked at again
        self._record_at = self._lapsed_at = self._watched_at = time.monotonic()
        self.lost_at = 0.0  # monotonic time the primary was judged lost (0: not yet)
        self.stall = StallClock(time.monotonic())
        # follows whoever leads the robot, as a replica does: after another standby took over, its stream and
        # its liveliness are the ones watched
        super().__init__(node, session, primary, stream_qos(lease_ms),
                         SubscriptionEventCallbacks(liveliness=self._on_liveliness), follow_leader=True,
                         thread_safe_actions=thread_safe_actions)
        self._silent_lapse = False  # a lapse judged from the leader's heartbeats, not from DDS liveliness
        self._ticker = node.create_timer(STALL_TICK_S, self._tick)

    def _tick(self) -> None:
        """The stall clock; and the leader's heartbeats: silent for HEARTBEAT_LAPSE_LEASES of this node's running
        time after one was heard, that is a lapse even while the stream's DDS liveliness holds (another writer on
        the stream topic keeps it alive: issue 44). Heard again within a lease, the lapse ends."""
        now = time.monotonic()
        self.stall.tick(now)
        heard = self.heard_at(self.primary)
        if heard == -float("inf") or self.lost_at:
            return
        silent_s = now - heard - self.stall.stalled_s(heard, now)
        if not self._lapsed and silent_s >= HEARTBEAT_LAPSE_LEASES * self.lease_s:
            self._lapsed, self._lapsed_at, self._silent_lapse = True, now, True
            self.node.get_logger().info(f"{self.primary}: no heartbeat for {silent_s * 1e3:.0f} ms while its "
                                        "stream's liveliness holds (another writer on the stream?): a lapse")
            self._check_lapse()
        elif self._silent_lapse and self._lapsed and silent_s < self.lease_s:
            self._lapsed = self._silent_lapse = False
            self.node.get_logger().info(f"{self.primary}: heartbeats again; standing by")

    def _on_record(self, msg) -> None:
        self._record_at = time.monotonic()
        super()._on_record(msg)
        last = self.replica.last
        if last is not None:
            self.buffer.recorded(last.stamp_ns)  # stepped by the primary before its newest record reached us

    def hold(self, msg) -> None:
        """An observation while the primary leads (executor thread)."""
        header = getattr(msg, "header", None)
        stamp = stamp_to_ns(header.stamp) if header is not None else 0
        last = self.replica.last
        if not self.buffer.hold(stamp, time.monotonic(), msg, last.stamp_ns if last is not None else None):
            return
        if self._lapsed and len(self.buffer) == 1:  # work for a lapsed primary: its record is due from now on
            self._check_lapse()

    def pending(self) -> list:
        """The observations after what a takeover continues from (replica.newest()), oldest first."""
        last = self.replica.newest()
        after = last.stamp_ns if last is not None else -1
        return self.buffer.after(after)

    def _on_liveliness(self, info) -> None:
        if info.alive_count > 0:
            # lost_at: a loss the node did not act on (nothing held): watch again
            if (self._lapsed and not self._unconfirmed) or self.lost_at:
                self.node.get_logger().info(f"{self.primary}: alive again; standing by")
                self.lost_at = 0.0
            self._alive_seen, self._lapsed, self._unconfirmed = True, False, False
            return
        if self._alive_seen:
            if not self._lapsed:
                self._lapsed, self._lapsed_at = True, time.monotonic()
                self.node.get_logger().info(f"{self.primary}: liveliness lapsed; taking over if its records stay away")
            self._check_lapse()

    def _check_lapse(self) -> None:
        if not self._lapsed or self.lost_at:
            return
        now = time.monotonic()
        if self.buffer:  # the oldest observation the primary has not recorded: its record is due since then
            since, need = max(self._record_at, self.buffer.oldest_arrival()), QUIET_LEASES * self.lease_s
            why = "lapsed and no record for {:.0f} ms with an observation to step"
        else:
            since, need = self._lapsed_at, IDLE_LEASES * self.lease_s
            why = "lapsed for {:.0f} ms with nothing to step"
        stalled_s = self.stall.stalled_s(since, now)
        waited_s = now - since - stalled_s
        need += self.stall.stalled_s(self._lapsed_at - IDLE_LEASES * self.lease_s, now)
        need += self.delay_s
        if waited_s < need:  # look again when it would be enough (sooner if an observation comes)
            self._recheck_in(need - waited_s)
            return
        # the lease: the leader stops publishing lease - margin after its last proof; its heartbeat left no
        # earlier than that proof, so lease + margin after it arrived here (this node's own stalls not counted)
        # the leader has been silent for 2 margins
        proof_at = max(self.heard_at(self.primary), self._watched_at)
        silent_s = now - proof_at - self.stall.stalled_s(proof_at, now)
        lease_need = (1.0 + LEASE_MARGIN) * self.lease_s
        if silent_s < lease_need:
            self._recheck_in(lease_need - silent_s)
            return
        self.lost_at = now
        still = f" (and {stalled_s * 1e3:.0f} ms this node stood still)" if stalled_s else ""
        seen = "not seen alive since it claimed the robot: " if self._unconfirmed else ""
        self.node.get_logger().warning(f"{self.primary}: {seen}liveliness " + why.format(waited_s * 1e3) + still)
        self.on_primary_lost(self)

    def _follow(self, claim) -> bool:
        """Another node leads the robot now: watch its stream and liveliness from scratch. Until it is seen
        alive, its silence counts as a lapse from the claim on (it may die before its liveliness ever reached
        this node, and then no event would come)."""
        if not super()._follow(claim):
            return False
        self._cancel_recheck()
        self._alive_seen = self._lapsed = self._unconfirmed = True
        self.lost_at = 0.0
        self._record_at = self._lapsed_at = self._watched_at = time.monotonic()
        self._check_lapse()
        return True

    def _recheck_in(self, delay_s: float) -> None:
        self._cancel_recheck()  # one at a time (a timer repeats: a second one would leak)
        self._recheck = self.node.create_timer(delay_s, self._recheck_once)

    def _cancel_recheck(self) -> None:
        if self._recheck is not None:
            self.node.destroy_timer(self._recheck)
            self._recheck = None

    def _recheck_once(self) -> None:
        self._cancel_recheck()
        self._check_lapse()

    def destroy(self) -> None:
        self.node.destroy_timer(self._ticker)
        self._cancel_recheck()
        super().destroy()
