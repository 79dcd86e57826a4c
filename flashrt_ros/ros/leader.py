"""Who leads the robot (issue 18, point 3): the node that steps its observations and publishes its actions
announces itself on ``<robot namespace>/flashrt_leader`` (flashrt_interfaces/Leader: epoch, node, step, and
the capsule it continued from),
reliable and transient local, so a node that starts later learns the leader at once and the message goes
away with the node that published it.

A primary claims epoch 1; a standby that takes over claims the newest epoch it has seen + 1. A leader that
sees another node claim a newer epoch (or the same epoch, claimed earlier) is deposed: it stops stepping and
publishing, and says so. A primary frozen for longer than the liveliness lease (SIGSTOP, a stalled machine)
and then resumed therefore goes quiet instead of publishing beside the standby that replaced it.

The lease (issue 44, docs/leadership.md): a leader publishes its actions only while it can prove its lease is
current. The executor thread, the one that steps and publishes, renews it every LEASE_RENEW leases by
publishing a heartbeat on ``<robot namespace>/flashrt_lease`` (the claim again, volatile); the proof is the
time taken just before that publish. An action, trajectory or policy_step goes out only within
``lease - margin`` of the last proof (``current()``). Past that (a stall of any length longer than that), the
node holds its observations and outputs, renews, and resumes only after REPROVE_LEASES leases in which no
newer claim came; a standby takes over only ``lease + margin`` after the last heartbeat it heard
(standby.py). Same machine, one monotonic clock: the leader's window closes 2 margins before the standby's
opens.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.validate_full_topic_name import validate_full_topic_name

from flashrt_interfaces.msg import Leader

from ..runtime.persist.replica import MAX_EPOCH
from .auth import leader_mac, valid
from .slow_publish import SLOW_PUBLISH_MS

LEADER_TOPIC = "flashrt_leader"
LEASE_TOPIC = "flashrt_lease"
LEASE_MARGIN = 0.25  # of the lease: the leader stops this much before it, a standby waits this much after it
LEASE_RENEW = 0.25  # of the lease: how often the leader renews (a late tick leaves it 0.5 lease of slack)
# After a stall past its lease: how long a leader listens for a newer claim after renewing, before it resumes.
# A standby decides before it hears the renewal, and its claim lands within the delivery bound (docs/leadership.md).
REPROVE_LEASES = 1.0
# A primary's first claim: held until this long after its first observation arrived (and after the claim), so a
# node of the same name that already leads (a launch file started twice) is heard first: discovery of the
# sensor and of that node run side by side. While another process of this name renews its lease (its heartbeats,
# another claim's stamp), the hold goes on.
START_HOLD_S = 1.0
# Claims from outside (issue 44.3), without a key: an epoch within CLAIM_HEADROOM of the last is never claimed (a
# takeover always has an epoch left), a claim may raise the newest epoch seen by one at most, and a claim counts
# only once its node has a writer on the leader topic in the ROS graph (waited for up to CLAIM_VERIFY_S: the
# graph can learn a node's name after its data arrived).
CLAIM_HEADROOM = 1024
MAX_CLAIM = MAX_EPOCH - CLAIM_HEADROOM
CLAIM_VERIFY_S = 3.0


def leader_qos(depth: int = 1) -> QoSProfile:
    """A writer keeps its one claim (depth 1). A reader keeps more: claims of several nodes can arrive before
    one is taken (its own and another's, at start-up), and depth 1 would keep only the newest of them."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


READER_DEPTH = 16


def lease_qos() -> QoSProfile:
    """Heartbeats: only the newest counts, and a late joiner needs none from before it joined."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE)


def stamp_of(msg: Leader) -> int:
    return msg.stamp.sec * 10**9 + msg.stamp.nanosec


def outranks(theirs: Leader, epoch: int, stamp_ns: int) -> bool:
    """Their claim beats ours (epoch, then the earlier claim)."""
    their_stamp = theirs.stamp.sec * 10**9 + theirs.stamp.nanosec
    return theirs.epoch > epoch or theirs.epoch == epoch and their_stamp < stamp_ns


def authentic(node, claim: Leader, key: bytes | None) -> bool:
    """With a key (capsule_hmac_key_file), a claim must carry its valid MAC (auth.py); logged (throttled) when not."""
    if valid(key, claim, leader_mac):
        return True
    node.get_logger().error(f"leader claim of {claim.node!r} (epoch {claim.epoch}) ignored: no valid HMAC under "
                            "capsule_hmac_key_file's key", throttle_duration_sec=1.0)
    return False


def well_formed(node, claim: Leader) -> bool:
    """A claim is outside input: its node must be a name a node can have (topics are built on it). Logged
    (throttled) and ignored when not. Nothing here tells a forged claim of a well-formed name: DDS security
    (SROS2) decides who may publish on the topic."""
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
    """Outside input's rules for a well-formed claim (no key): it may raise ``newest`` (the newest epoch seen,
    0: none yet) by one at most, and its node must have a writer on the leader topic. A claim whose node is not
    in the graph yet waits (``due()``, from a timer) for up to CLAIM_VERIFY_S, then is logged and ignored."""

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


class LeaderGuard:
    def __init__(self, node, topic: str, on_deposed: Callable[[Leader], None], lease_ms: float = 100.0,
                 on_proven: Callable[[], None] = lambda: None, key: bytes | None = None):
        """``on_proven()``: the lease is current again after a hold (executor thread): publish what was held.
        ``key``: claims (ours and theirs) are signed and checked with it (auth.py); None: the no-key rules."""
        self.node, self.on_deposed, self.on_proven, self.key = node, on_deposed, on_proven, key
        self.name = node.get_fully_qualified_name()
        self.epoch = 0  # 0: not claimed
        self.newest_seen = 0  # the newest epoch any node claimed
        self._stamp_ns = 0
        self._claimer: threading.Thread | None = None
        self.lease_s = lease_ms / 1e3
        self.margin_s = LEASE_MARGIN * self.lease_s
        self.proof = -math.inf  # monotonic time taken just before the last heartbeat (or claim) went out
        self.holding = False  # the lease lapsed (or was never proven): outputs wait for a clean check
        self.holds = 0  # holds begun (a stall past lease - margin, or the start)
        self.heard: dict[str, float] = {}  # node -> monotonic time its newest heartbeat arrived
        self._hold_timers: list = []
        self._claim: Leader | None = None
        self._starting = False  # the start hold: ends START_HOLD_S after the first observation (observed())
        self._namesake_at = -math.inf  # when a heartbeat of this name with another claim's stamp last arrived
        self._first_observation = 0.0
        self.pub = node.create_publisher(Leader, topic, leader_qos())
        self.check = ClaimCheck(node, self.pub.topic_name)
        self.sub = node.create_subscription(Leader, topic, self._on_leader, leader_qos(READER_DEPTH))
        lease_topic = f"{topic.rsplit('/', 1)[0]}/{LEASE_TOPIC}" if "/" in topic else LEASE_TOPIC
        self.lease_pub = node.create_publisher(Leader, lease_topic, lease_qos())
        self.lease_sub = node.create_subscription(Leader, lease_topic, self._on_heartbeat, lease_qos())
        self._renewer = node.create_timer(LEASE_RENEW * self.lease_s, self.renew)

    def claim(self, epoch: int, step: int, capsule_id: int, hold_s: float = 0.0) -> None:
        """``hold_s``: publish nothing for that long (at least), listening for a newer claim (a primary's start)."""
        now = self.node.get_clock().now()
        self.epoch, self._stamp_ns = epoch, now.nanoseconds
        self.newest_seen = max(self.newest_seen, epoch)
        self.proof = time.monotonic()
        msg = self._claim_msg(step, capsule_id, now.to_msg())
        self._claim = msg
        # From a thread of its own: after a kill -9 the dead primary's reader of this topic is still matched, and
        # a send to its shared-memory port can wait out Fast DDS's health check (1 s) inside publish; the
        # takeover's held steps and first actions must not wait behind it (the claim's order vs them is free:
        # a deposed node learns of the claim whenever it lands).
        self._claimer = threading.Thread(target=self._publish, args=(msg,), name="flashrt_leader_claim", daemon=True)
        self._claimer.start()
        if hold_s > 0:
            self._starting, self._first_observation = True, 0.0
            self._hold(hold_s, "")

    def observed(self) -> None:
        """An observation arrived while held (the node's executor thread)."""
        if self._starting and not self._first_observation:
            self._first_observation = time.monotonic()

    def _namesake_leads(self) -> bool:
        """Another process of this node's name renewed a lease within lease + margin."""
        return time.monotonic() - self._namesake_at < self.lease_s + self.margin_s

    def _claim_msg(self, step: int, capsule_id: int, stamp) -> Leader:
        msg = Leader(stamp=stamp, epoch=self.epoch, node=self.name, step=step, capsule_id=capsule_id)
        if self.key is not None:
            msg.mac = leader_mac(self.key, msg)
        return msg

    # ---- the lease ------------------------------------------------------------------------
    def current(self) -> bool:
        """This node leads and may publish now: its last proof is within lease - margin."""
        return bool(self.epoch) and not self.holding and time.monotonic() - self.proof < self.lease_s - self.margin_s

    def renew(self) -> None:
        """Executor thread (a timer, and on a lapse seen at a publish): a heartbeat; a lapsed lease is held."""
        for msg in self.check.due():
            self._on_leader(msg, checked=True)
        if not self.epoch:
            return
        lapsed_s = time.monotonic() - self.proof
        self._heartbeat()
        if lapsed_s >= self.lease_s - self.margin_s and not self.holding:
            self._hold(REPROVE_LEASES * self.lease_s,
                       f"lease lapsed ({lapsed_s * 1e3:.0f} ms since its last proof, lease "
                       f"{self.lease_s * 1e3:.0f} ms): holding outputs and observations while checking that no "
                       "newer leader exists")

    def _heartbeat(self) -> None:
        t0, msg = time.monotonic(), self._claim
        if msg is None:
            return
        try:
            self.lease_pub.publish(msg)
        except Exception as e:  # noqa: BLE001 - deactivating meanwhile: no proof
            self.node.get_logger().warning(f"lease not renewed: {e}", throttle_duration_sec=1.0)
            return
        self.proof = max(self.proof, t0)  # taken before the publish: no standby heard it earlier

    def _hold(self, wait_s: float, why: str) -> None:
        self.holding = True
        self.holds += 1
        if why:
            self.node.get_logger().warning(why)
        self._cancel_hold()
        self._hold_timers.append(self.node.create_timer(wait_s, self._hold_waited))

    def _hold_waited(self) -> None:
        """The wait is over. One more pass of the executor first, so a claim that arrived with this timer's
        wake-up is taken before the outputs go out."""
        self._cancel_hold()
        if self._starting:
            left = (START_HOLD_S - (time.monotonic() - self._first_observation) if self._first_observation
                    else START_HOLD_S)
            if self._namesake_leads():
                self.node.get_logger().warning(f"another process named {self.name} holds the lease: not starting "
                                               "while it does", throttle_duration_sec=5.0)
                left = max(left, self.lease_s)
            if left > 0:
                self._hold_timers.append(self.node.create_timer(left, self._hold_waited))
                return
            self._starting = False
        self._hold_timers.append(self.node.create_timer(0.0, self._hold_over))

    def _hold_over(self) -> None:
        self._cancel_hold()
        if not self.epoch:  # deposed meanwhile: what was held is dropped by the node
            return
        self._heartbeat()
        self.holding = False
        self.on_proven()

    def _cancel_hold(self) -> None:
        for t in self._hold_timers:
            self.node.destroy_timer(t)
        self._hold_timers = []

    def heard_at(self, node: str) -> float:
        """Monotonic time the newest heartbeat of ``node`` arrived (-inf: none)."""
        return self.heard.get(node, -math.inf)

    def _on_heartbeat(self, msg: Leader) -> None:
        if msg.node == self.name and stamp_of(msg) == self._stamp_ns:
            return  # our own
        if not authentic(self.node, msg, self.key):
            return
        self.heard[msg.node] = time.monotonic()
        if msg.node == self.name:
            self._namesake_at = self.heard[msg.node]
        if self.epoch and msg.epoch > self.epoch:
            self._on_leader(msg)  # a newer leader's heartbeat deposes as its claim does

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

    def _on_leader(self, msg: Leader, checked: bool = False) -> None:
        if not well_formed(self.node, msg):
            return
        ours = msg.node == self.name and stamp_of(msg) == self._stamp_ns
        if not ours and not authentic(self.node, msg, self.key):
            return
        if not ours and not checked and self.key is None and not self.check.admit(msg, self.newest_seen):
            return
        self.newest_seen = max(self.newest_seen, msg.epoch)
        # ours is the claim of this name at our stamp: another process of the same name (a launch file started
        # twice) is another claimant, and the earlier claim of an epoch wins
        if not ours and self.epoch and outranks(msg, self.epoch, self._stamp_ns):
            self.epoch = 0
            self.holding = False
            self._cancel_hold()
            self.on_deposed(msg)

    def destroy(self) -> None:
        self.epoch = 0
        self._cancel_hold()
        self.node.destroy_timer(self._renewer)
        if self._claimer is not None:
            self._claimer.join(timeout=2.0)  # a claim still waiting on a dead port: longer than its health check
        for sub in (self.sub, self.lease_sub):
            self.node.destroy_subscription(sub)
        for pub in (self.pub, self.lease_pub):
            self.node.destroy_publisher(pub)


class LeaderWatch:
    """A reader of the robot's leader claims (a replica): calls ``on_new_leader(claim)`` when the best claim
    seen (newest epoch, then the earlier claim) names another node than the one followed. A deposed node's
    claim stays on the topic (transient local) until its process ends, so the best claim, not the newest
    to arrive, is the leader."""

    def __init__(self, node, topic: str, following: str, on_new_leader: Callable[[Leader], None],
                 key: bytes | None = None):
        self.node, self.topic, self.following, self.on_new_leader = node, topic, following, on_new_leader
        self.key = key
        self.best: Leader | None = None
        self.sub = node.create_subscription(Leader, topic, self._on_leader, leader_qos(READER_DEPTH))
        self.check = ClaimCheck(node, self.sub.topic_name)
        self._checker = node.create_timer(0.1, self._check_due)

    def _claimants(self) -> set[str]:
        return claimants(self.node, self.topic)

    def _check_due(self) -> None:
        for msg in self.check.due():
            self._on_leader(msg, checked=True)

    def _on_leader(self, msg: Leader, checked: bool = False) -> None:
        if not well_formed(self.node, msg) or msg.node == self.node.get_fully_qualified_name():
            return
        if not authentic(self.node, msg, self.key):
            return
        if not checked and self.key is None and \
                not self.check.admit(msg, self.best.epoch if self.best is not None else 0):
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
        self.node.destroy_timer(self._checker)
        self.node.destroy_subscription(self.sub)
