"""A node's part in a group of flashrt nodes (issue 18): which services its role serves, where its robot's
topics are, and the role changes: a replica or standby activating, a standby taking over from a primary
whose process stopped, a leader deposed by a newer epoch. A mixin of FlashRTNode (node.py), which owns
the session, the lifecycle and the state it reads here (_own, _replica, _stream, _leader, _deposed).
"""
from __future__ import annotations

import time

from rclpy.lifecycle import TransitionCallbackReturn

from ..runtime.persist.replica import MAX_EPOCH
from .capsule_stream import StreamPublisher
from .replica import REPLICA_SERVICES, ReplicaLink, replica_refusal
from .standby import StandbyLink


class NodeRoles:
    def role_refusal(self, what: str) -> str:
        """'' when this node's role serves ``what`` (a service name, or 'a committing replan')."""
        if self._own.get("role", "primary") == "primary" or what in REPLICA_SERVICES:
            return ""
        return replica_refusal(self._replica.primary if self._replica is not None else self._own["primary"], what)

    def commit_forwarder(self) -> ReplicaLink | None:
        """A replica's (or a standby's, before it takes over) link to its primary, where commits go."""
        return self._replica

    def robot_topic(self, name: str) -> str:
        """Where the robot's ``name`` topic is: relative for a primary, the primary's for a standby (also after
        it took over)."""
        ns = self._own.get("robot_namespace")
        return name if ns is None else f"{ns}/{name}"

    def _activate_replica(self, link: ReplicaLink) -> TransitionCallbackReturn:
        self._replica, self._active = link, True
        self.get_logger().info(f"activate: now active as a {self._own['role']} of {self._own['primary']}, rebuilding "
                               f"its capsules from '{link.sub.topic_name}'; list_capsules, export_capsule and replans "
                               "(a commit is forwarded to the primary) open")
        return TransitionCallbackReturn.SUCCESS

    def _lead(self, epoch: int) -> None:
        """Claim flashrt_leader at ``epoch`` and publish the capsule stream (executor thread)."""
        self._leader.claim(epoch, self.session.step_count, self.session.live_capsule_id)
        self._start_stream(epoch)

    def _start_stream(self, epoch: int) -> None:
        if self._own["capsule_stream"]:
            self._stream = StreamPublisher(self, self.session, self._own["stream_keyframe_s"], epoch,
                                           self._own["liveliness_lease_ms"])

    def _take_over(self, link: StandbyLink) -> None:
        """The primary's process is gone (liveliness, executor thread): continue from the newest record."""
        session, pending = self.session, link.pending()
        last, epoch = link.replica.newest(), max(link.epoch, self._leader.newest_seen) + 1
        if last is None:  # nothing to continue from: stepping from zeros would be another robot's policy
            self.get_logger().error(f"{link.primary} stopped before this standby held any capsule of its timeline: "
                                    "not taking over (start the standby before the primary steps, or restart the "
                                    "primary)")
            return
        if not 2 <= epoch <= MAX_EPOCH:  # checked while this is still a standby: lead() would refuse it midway
            self.get_logger().error(f"not taking over from {link.primary}: epoch {epoch} is past the last a leader "
                                    f"can have ({MAX_EPOCH}); restart the robot's nodes with a fresh timeline")
            return
        link.destroy()
        self._replica = None
        t0 = time.perf_counter()
        session.rollback(last.id)  # row 0 exactly that capsule, whatever a refused record left in it
        link.replica.lead(epoch)  # its capsules take its epoch's ids
        rollback_ms = (time.perf_counter() - t0) * 1e3
        self._own["role"] = "primary"  # serves every service from here
        self._leader.claim(epoch, last.step, last.id)
        t1 = time.perf_counter()
        for msg in pending:
            self.step_from_message(msg)
        t2 = time.perf_counter()
        self._start_stream(epoch)  # after the catch-up: its first record (a whole window) costs no held step
        t3 = time.perf_counter()
        self.get_logger().warning(
            f"took over from {link.primary} (epoch {epoch}) {(time.monotonic() - link.lost_at) * 1e3:.0f} ms after "
            f"judging it lost; continued from capsule {last.id} (restored in {rollback_ms:.1f} ms, leader claimed "
            f"in {(t1 - t0) * 1e3 - rollback_ms:.1f} ms), stepped {len(pending)} held observations in "
            f"{(t2 - t1) * 1e3:.1f} ms, started the stream in {(t3 - t2) * 1e3:.1f} ms; "
            f"{(t3 - t0) * 1e3:.1f} ms in all; now at step {session.step_count}, publishing on "
            f"{self.robot_topic('action')}")

    def _on_deposed(self, leader) -> None:
        self._deposed = (f"deposed: {leader.node} leads the robot since epoch {leader.epoch} (a standby took over); "
                         "this node steps and publishes nothing more")
        if self._stream is not None:
            self._stream.destroy()
            self._stream = None
        self.get_logger().error(self._deposed)
