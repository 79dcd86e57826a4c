"""A node's part in a group of flashrt nodes (issue 18), and the standby takeover in one place: which services
its role serves, where its robot's topics are, and the role changes (a replica or standby activating, a standby
taking over from a primary whose process stopped, a leader deposed by a newer epoch). The node owns one
GroupRole per configure and hands it the session and the parameters it needs; the links it holds while
active (stream, replica or standby, leader guard) live here.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from rclpy.qos import QoSProfile

from .claims import MAX_CLAIM
from .leader import LEADER_TOPIC, REPROVE_LEASES, START_DISCOVERY_S, START_HOLD_S, LeaderGuard
from .replica import REPLICA_SERVICES, ReplicaLink, replica_refusal, role_diagnostics
from .standby import StandbyLink
from .stream import StreamPublisher

STANDBY_OBSERVATION_DEPTH = 200  # a standby's observation queue: 2 s at 100 Hz, past any takeover's catch-up


def robot_topic(namespace: str | None, name: str) -> str:
    """Where the robot's ``name`` topic is: relative for a primary, the primary's for a standby (also after it
    took over)."""
    return name if namespace is None else f"{namespace}/{name}"


class GroupRole:
    """``own``: the node's parameters of the last configure (role, primary, robot_namespace, capsule_stream,
    stream_keyframe_s, liveliness_lease_ms, standby_takeover_delay_ms, thread_safe_action_client).
    ``step``: steps one observation (the node's stepping), for the held observations of a takeover.
    ``on_epoch(epoch)``: this node leads at ``epoch`` from now on: every command carries it (io/fence.py)."""

    def __init__(self, node, session, own: dict, step: Callable[[object], None],
                 on_epoch: Callable[[int], None] = lambda epoch: None):
        self.node, self.session, self.own, self.step, self.on_epoch = node, session, own, step, on_epoch
        self.role, self.primary = own["role"], own["primary"]
        self.stream: StreamPublisher | None = None  # role primary, capsule_stream on: while active
        self.replica: ReplicaLink | None = None  # role replica or standby: while active (until a takeover)
        self.leader: LeaderGuard | None = None  # primary and standby: while active
        self.deposed = ""  # why this node stopped leading (a standby took over): it steps nothing more
        # the lease (group/leader.py): while it is not proven the node steps on, and its outputs wait here, in order
        self._deferred: list = []  # (publish, args)
        self._stream_due = 0  # the epoch of a stream that starts when the start hold ends

    def robot_topic(self, name: str) -> str:
        return robot_topic(self.own["robot_namespace"], name)

    def role_refusal(self, what: str) -> str:
        """'' when this node's role serves ``what`` (a service name, or 'a committing replan')."""
        if self.role == "primary" or what in REPLICA_SERVICES:
            return ""
        return replica_refusal(self.replica.primary if self.replica is not None else self.primary, what)

    def observation_qos(self, qos):
        """A standby's observations are held from its newest record on, and never dropped while it takes over."""
        if self.role != "standby":
            return qos
        return QoSProfile(history=qos.history, depth=max(qos.depth, STANDBY_OBSERVATION_DEPTH),
                          reliability=qos.reliability, durability=qos.durability)

    def on_observation(self, msg) -> None:
        # [replan] stepped here even while a replan runs: the replan computes its batched steps outside the
        # runtime lock, so this step waits at most for one of its bookkeeping sections (runtime/replan.py)
        if self.replica is not None:  # a standby, while the primary leads
            self.replica.hold(msg)
        elif not self.deposed:
            self.step(msg)  # its outputs wait while the lease is not proven (fenced)

    # ---- the lease: nothing goes out unless it is proven ---------------------------------------
    def fenced(self, publish, *args) -> None:
        """A step's output goes out only under a current lease; else it waits for the proof (or goes with a
        deposition). The step itself is taken: its capsule record goes out, so a standby sees a living primary
        (holding the observations instead delayed the records by the hold, and a standby took over from a primary
        that had only stood still with the whole machine). Executor thread."""
        guard = self.leader
        if guard is None or not self._deferred and guard.current():
            publish(*args)
            return
        if guard.epoch:
            self._deferred.append((publish, args))
            guard.observed()  # a step waits (the start hold counts from the first one)
            guard.check_lease()  # stalled mid-step: the hold starts

    def _lease_proven(self) -> None:
        """The lease is current again and no newer leader claimed the robot: what was held goes out, in order."""
        deferred, self._deferred = self._deferred, []
        for publish, args in deferred:
            try:
                publish(*args)
            except Exception as e:  # noqa: BLE001 - deactivated meanwhile
                self.node.get_logger().warning(f"held output not published: {e}")
        self.node.get_logger().info(f"lease proven: no newer leader; published {len(deferred)} held outputs")
        if self._stream_due:  # the start hold is over: this node leads
            self._start_stream(self._stream_due)
            self._stream_due = 0

    def _drop_held(self) -> int:
        n = len(self._deferred)
        self._deferred = []
        return n

    # ---- activate / deactivate ------------------------------------------------------------------
    def follow_primary(self) -> str:
        """Role replica: rebuild the primary's store from its stream. Returns the activate line."""
        self.deposed = ""
        return self._replica_line(ReplicaLink(self.node, self.session, self.primary, follow_leader=True,
                                              thread_safe_actions=self.own["thread_safe_action_client"]))

    def guard_leadership(self) -> None:
        """Primary and standby: watch flashrt_leader (a newer claim deposes this node)."""
        self.deposed = ""
        self.leader = LeaderGuard(self.node, self.robot_topic(LEADER_TOPIC), self._on_deposed,
                                  self.own["liveliness_lease_ms"], self._lease_proven, self.session.capsule_hmac_key)

    def stand_by(self) -> str:
        """Role standby: follow the primary until its process stops, then take over. Returns the activate line."""
        return self._replica_line(StandbyLink(self.node, self.session, self.primary, self.own["liveliness_lease_ms"],
                                              self._take_over, self.own["standby_takeover_delay_ms"],
                                              self.own["thread_safe_action_client"], self.leader.heard_at))

    def _replica_line(self, link: ReplicaLink) -> str:
        self.replica = link
        return (f"activate: now active as a {self.role} of {self.primary}, rebuilding its capsules from "
                f"'{link.sub.topic_name}'; list_capsules, export_capsule and replans (a commit is forwarded to the "
                "primary) open")

    def lead(self, epoch: int) -> None:
        """Claim flashrt_leader at ``epoch`` and publish the capsule stream (executor thread). Nothing is
        published before START_HOLD_S after its first observation and START_DISCOVERY_S after the claim have
        passed without a claim that outranks this one (a node of the same name that leads already: a launch file
        started twice)."""
        self.on_epoch(epoch)
        self.leader.claim(epoch, self.session.step_count, self.session.live_capsule_id,
                          hold_s=max(START_DISCOVERY_S, START_HOLD_S, REPROVE_LEASES * self.leader.lease_s))
        self._stream_due = epoch  # a namesake's stream is this node's topic: none before the hold is over

    def _start_stream(self, epoch: int) -> None:
        if self.own["capsule_stream"]:
            self.stream = StreamPublisher(self.node, self.session, self.own["stream_keyframe_s"], epoch,
                                          self.own["liveliness_lease_ms"])

    def deactivate(self) -> None:
        for link in (self.stream, self.replica, self.leader):
            if link is not None:
                link.destroy()
        self.stream = self.replica = self.leader = None
        self._drop_held()

    def diagnostics(self) -> tuple[dict, str]:
        return role_diagnostics(self.role, self.stream, self.replica, self.leader, self.deposed)

    # ---- role changes ---------------------------------------------------------------------------
    def _take_over(self, link: StandbyLink) -> None:
        """The primary's process is gone (liveliness, executor thread): continue from the newest record."""
        session, pending = self.session, link.pending()
        logger = self.node.get_logger()
        last, epoch = link.replica.newest(), max(link.epoch, self.leader.newest_seen) + 1
        if last is None:  # nothing to continue from: stepping from zeros would be another robot's policy
            logger.error(f"{link.primary} stopped before this standby held any capsule of its timeline: not taking "
                         "over (start the standby before the primary steps, or restart the primary)")
            return
        if not 2 <= epoch <= MAX_CLAIM:  # checked while this is still a standby: lead() would refuse it midway
            logger.error(f"not taking over from {link.primary}: epoch {epoch} is past the last a leader can claim "
                         f"({MAX_CLAIM}); restart the robot's nodes with a fresh timeline")
            return
        link.destroy()
        self.replica = None
        t0 = time.perf_counter()
        session.rollback(last.id)  # row 0 exactly that capsule, whatever a refused record left in it
        link.replica.lead(epoch)  # its capsules take its epoch's ids
        rollback_ms = (time.perf_counter() - t0) * 1e3
        self.role = "primary"  # serves every service from here
        self.on_epoch(epoch)
        self.leader.claim(epoch, last.step, last.id)
        t1 = time.perf_counter()
        for msg in pending:
            self.step(msg)
        t2 = time.perf_counter()
        self._start_stream(epoch)  # after the catch-up: its first record (a whole window) costs no held step
        t3 = time.perf_counter()
        logger.warning(
            f"took over from {link.primary} (epoch {epoch}) {(time.monotonic() - link.lost_at) * 1e3:.0f} ms after "
            f"judging it lost; continued from capsule {last.id} (restored in {rollback_ms:.1f} ms, leader claimed "
            f"in {(t1 - t0) * 1e3 - rollback_ms:.1f} ms), stepped {len(pending)} held observations in "
            f"{(t2 - t1) * 1e3:.1f} ms, started the stream in {(t3 - t2) * 1e3:.1f} ms; "
            f"{(t3 - t0) * 1e3:.1f} ms in all; now at step {session.step_count}, publishing on "
            f"{self.robot_topic('action')}")

    def _on_deposed(self, leader) -> None:
        same = self.leader is not None and leader.node == self.leader.name
        self.deposed = (f"deposed: {leader.node} leads the robot since epoch {leader.epoch} "
                        f"({'another process of this name claimed it first' if same else 'a standby took over'}); "
                        f"this node steps and publishes nothing more ({self._drop_held()} held outputs dropped)")
        if self.stream is not None:
            self.stream.destroy()
            self.stream = None
        self.node.get_logger().error(self.deposed)
