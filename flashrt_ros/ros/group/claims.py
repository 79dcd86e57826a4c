"""Leader claims are outside input (issue 44.3, docs/leadership.md): the rules a claim must pass before it
counts. With a key (capsule_hmac_key_file), a claim must carry its valid HMAC (io/auth.py). Without one: an
epoch within CLAIM_HEADROOM of the last is never claimed (a takeover always has an epoch left), a claim may raise
the newest epoch seen by one at most, and a claim counts only once its node has a writer on the leader topic in
the ROS graph (waited for up to CLAIM_VERIFY_S: the graph can learn a node's name after its data arrived).

Two processes of one name (a launch file started twice) are told apart by ``instance``, a random number each
process draws once: neither a name nor a stamp tells them apart on every rmw.
"""
from __future__ import annotations

import secrets
import time

from rclpy.validate_full_topic_name import validate_full_topic_name

from flashrt_interfaces.msg import Leader

from ...runtime.persist.replica import MAX_EPOCH
from ..io.auth import leader_mac, valid

CLAIM_HEADROOM = 1024
MAX_CLAIM = MAX_EPOCH - CLAIM_HEADROOM
CLAIM_VERIFY_S = 3.0
INSTANCE = secrets.randbits(63) | 1  # this process's (never 0: 0 is a claim without one)


def stamp_of(msg: Leader) -> int:
    return msg.stamp.sec * 10**9 + msg.stamp.nanosec


def outranks(theirs: Leader, epoch: int, stamp_ns: int, instance: int = 0) -> bool:
    """Their claim beats ours: the newer epoch, then the earlier claim, then (one stamp) the larger instance."""
    if theirs.epoch != epoch:
        return theirs.epoch > epoch
    if stamp_of(theirs) != stamp_ns:
        return stamp_of(theirs) < stamp_ns
    return theirs.instance > instance


def outranks_claim(theirs: Leader, ours: Leader) -> bool:
    return outranks(theirs, ours.epoch, stamp_of(ours), ours.instance)


def same_claimant(msg: Leader, name: str, instance: int) -> bool:
    return msg.node == name and msg.instance == instance


def authentic(node, claim: Leader, key: bytes | None) -> bool:
    """With a key, a claim must carry its valid MAC; logged (throttled) when not."""
    if valid(key, claim, leader_mac):
        return True
    node.get_logger().error(f"leader claim of {claim.node!r} (epoch {claim.epoch}) ignored: no valid HMAC under "
                            "capsule_hmac_key_file's key", throttle_duration_sec=1.0)
    return False


def well_formed(node, claim: Leader) -> bool:
    """Its node must be a name a node can have (topics are built on it), its epoch one a leader may claim.
    Logged (throttled) and ignored when not."""
    try:
        if not 1 <= claim.epoch <= MAX_CLAIM:
            raise ValueError(f"epoch {claim.epoch} outside 1..{MAX_CLAIM} (the last {CLAIM_HEADROOM} are never "
                             "claimed)")
        if not claim.node.startswith("/"):
            raise ValueError(f"node name {claim.node!r}: not a fully qualified name")
        validate_full_topic_name(f"{claim.node}/capsule_stream")
    except Exception as e:  # noqa: BLE001 - rclpy's InvalidTopicNameException and ours
        node.get_logger().error(f"leader claim of {claim.node!r} ignored: {e}", throttle_duration_sec=1.0)
        return False
    return True


def claimants(node, topic: str) -> set[str]:
    """The nodes with a writer on the leader topic now (the graph: a node gone takes its writer)."""
    return {f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in node.get_publishers_info_by_topic(topic)}


class ClaimCheck:
    """The no-key rules for a well-formed claim: it may raise ``newest`` (the newest epoch seen, 0: none yet) by
    one at most, and its node must have a writer on the leader topic. A claim whose node is not in the graph yet
    waits (``due()``, from a timer) for up to CLAIM_VERIFY_S, then is logged and ignored."""

    def __init__(self, node, topic: str):
        self.node, self.topic = node, topic
        self.pending: dict[str, tuple[float, Leader]] = {}

    def admit(self, msg: Leader, newest: int) -> bool:
        if newest and msg.epoch > newest + 1:
            self.node.get_logger().error(f"leader claim of {msg.node!r} ignored: epoch {msg.epoch} jumps past the "
                                         f"newest seen ({newest}) + 1", throttle_duration_sec=1.0)
            return False
        if msg.node in claimants(self.node, self.topic):
            self.pending.pop(msg.node, None)
            return True
        first = self.pending.get(msg.node, (time.monotonic(), msg))[0]
        self.pending[msg.node] = (first, msg)
        return False

    def due(self) -> list[Leader]:
        """The waiting claims whose node the graph now shows, oldest first; those waited out are dropped."""
        if not self.pending:
            return []
        known, now, out = claimants(self.node, self.topic), time.monotonic(), []
        for name, (first, msg) in sorted(self.pending.items(), key=lambda kv: kv[1][0]):
            if name in known:
                out.append(msg)
            elif now - first > CLAIM_VERIFY_S:
                self.node.get_logger().error(f"leader claim of {name!r} (epoch {msg.epoch}) ignored: no node of "
                                             f"that name has a writer on {self.topic}")
            else:
                continue
            del self.pending[name]
        return out
