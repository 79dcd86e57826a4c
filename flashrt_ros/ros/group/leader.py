"""Who leads the robot (issue 18, point 3): the node that steps its observations and publishes its actions
announces itself on ``<robot namespace>/flashrt_leader`` (flashrt_interfaces/Leader: epoch, node, step, and
the capsule it continued from),
reliable and transient local, so a node that starts later learns the leader at once and the message goes
away with the node that published it.

A primary claims epoch 1; a standby that takes over claims the newest epoch it has seen + 1. A leader that
sees another node claim a newer epoch (or the same epoch, claimed earlier) is deposed: it stops stepping and
publishing, and says so. A primary frozen for longer than the liveliness lease (SIGSTOP, a stalled machine)
and then resumed therefore goes quiet instead of publishing beside the standby that replaced it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.validate_full_topic_name import validate_full_topic_name

from flashrt_interfaces.msg import Leader

from ...runtime.persist.replica import MAX_EPOCH
from .slow_publish import SLOW_PUBLISH_MS

LEADER_TOPIC = "flashrt_leader"


def leader_qos(depth: int = 1) -> QoSProfile:
    """A writer keeps its one claim (depth 1). A reader keeps more: claims of several nodes can arrive before
    one is taken (its own and another's, at start-up), and depth 1 would keep only the newest of them."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


READER_DEPTH = 16


def outranks(theirs: Leader, epoch: int, stamp_ns: int) -> bool:
    """Their claim beats ours (epoch, then the earlier claim)."""
    their_stamp = theirs.stamp.sec * 10**9 + theirs.stamp.nanosec
    return theirs.epoch > epoch or theirs.epoch == epoch and their_stamp < stamp_ns


def well_formed(node, claim: Leader) -> bool:
    """A claim is outside input: its node must be a name a node can have (topics are built on it). Logged
    (throttled) and ignored when not. Nothing here tells a forged claim of a well-formed name: DDS security
    (SROS2) decides who may publish on the topic."""
    try:
        if not 1 <= claim.epoch <= MAX_EPOCH:
            raise ValueError(f"epoch {claim.epoch} outside 1..{MAX_EPOCH}")
        if not claim.node.startswith("/"):
            raise ValueError(f"node name {claim.node!r}: not a fully qualified name")
        validate_full_topic_name(f"{claim.node}/capsule_stream")
    except Exception as e:  # noqa: BLE001 - rclpy's InvalidTopicNameException and ours
        node.get_logger().error(f"leader claim of {claim.node!r} ignored: {e}", throttle_duration_sec=1.0)
        return False
    return True


class LeaderGuard:
    def __init__(self, node, topic: str, on_deposed: Callable[[Leader], None]):
        self.node, self.on_deposed = node, on_deposed
        self.name = node.get_fully_qualified_name()
        self.epoch = 0  # 0: not claimed
        self.newest_seen = 0  # the newest epoch any node claimed
        self._stamp_ns = 0
        self._claimer: threading.Thread | None = None
        self.pub = node.create_publisher(Leader, topic, leader_qos())
        self.sub = node.create_subscription(Leader, topic, self._on_leader, leader_qos(READER_DEPTH))

    def claim(self, epoch: int, step: int, capsule_id: int) -> None:
        now = self.node.get_clock().now()
        self.epoch, self._stamp_ns = epoch, now.nanoseconds
        self.newest_seen = max(self.newest_seen, epoch)
        msg = Leader(stamp=now.to_msg(), epoch=epoch, node=self.name, step=step, capsule_id=capsule_id)
        # From a thread of its own: after a kill -9 the dead primary's reader of this topic is still matched, and
        # a send to its shared-memory port can wait out Fast DDS's health check (1 s) inside publish; the
        # takeover's held steps and first actions must not wait behind it (the claim's order vs them is free:
        # a deposed node learns of the claim whenever it lands).
        self._claimer = threading.Thread(target=self._publish, args=(msg,), name="flashrt_leader_claim", daemon=True)
        self._claimer.start()

    def _publish(self, msg: Leader) -> None:
        t0 = time.monotonic()
        try:
            self.pub.publish(msg)
        except Exception as e:  # noqa: BLE001 - the node deactivated meanwhile: nobody to tell
            self.node.get_logger().warning(f"leader claim (epoch {msg.epoch}) not published: {e}")
            return
        waited_ms = (time.monotonic() - t0) * 1e3
        if waited_ms > SLOW_PUBLISH_MS:
            self.node.get_logger().warning(f"leader claim (epoch {msg.epoch}) took {waited_ms:.0f} ms to publish "
                                           "(a dead reader's shared-memory port)")

    def _on_leader(self, msg: Leader) -> None:
        if not well_formed(self.node, msg):
            return
        self.newest_seen = max(self.newest_seen, msg.epoch)
        if msg.node != self.name and self.epoch and outranks(msg, self.epoch, self._stamp_ns):
            self.epoch = 0
            self.on_deposed(msg)

    def destroy(self) -> None:
        if self._claimer is not None:
            self._claimer.join(timeout=2.0)  # a claim still waiting on a dead port: longer than its health check
        self.node.destroy_subscription(self.sub)
        self.node.destroy_publisher(self.pub)


class LeaderWatch:
    """A reader of the robot's leader claims (a replica): calls ``on_new_leader(claim)`` when the best claim
    seen (newest epoch, then the earlier claim) names another node than the one followed. A deposed node's
    claim stays on the topic (transient local) until its process ends, so the best claim, not the newest
    to arrive, is the leader."""

    def __init__(self, node, topic: str, following: str, on_new_leader: Callable[[Leader], None]):
        self.node, self.topic, self.following, self.on_new_leader = node, topic, following, on_new_leader
        self.best: Leader | None = None
        self.sub = node.create_subscription(Leader, topic, self._on_leader, leader_qos(READER_DEPTH))

    def _claimants(self) -> set[str]:
        """The nodes with a writer on the leader topic now (the graph: a node gone takes its writer)."""
        return {f"{i.node_namespace.rstrip('/')}/{i.node_name}"
                for i in self.node.get_publishers_info_by_topic(self.topic)}

    def _on_leader(self, msg: Leader) -> None:
        if not well_formed(self.node, msg) or msg.node == self.node.get_fully_qualified_name():
            return
        best = self.best
        if best is not None and best.node != msg.node and best.node not in self._claimants():
            best = None  # its node is gone (a restarted primary claims epoch 1 again after the standby died)
        if best is not None and not outranks(msg, best.epoch, best.stamp.sec * 10**9 + best.stamp.nanosec):
            return
        self.best = msg
        if msg.node != self.following:
            self.following = msg.node
            self.on_new_leader(msg)

    def destroy(self) -> None:
        self.node.destroy_subscription(self.sub)
