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
current (group/lease.py: heartbeats on ``<robot namespace>/flashrt_lease`` from a thread of its own, every
LEASE_RENEW leases). An action, trajectory or policy_step goes out only within ``lease - margin`` of the last
proof (``current()``). After a stall past that, the node holds its observations and outputs and resumes only
after REPROVE_LEASES leases in which no newer claim came; a standby takes over only ``lease + margin`` after the
last heartbeat it heard (standby.py). Claims are outside input: group/claims.py says which count.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from flashrt_interfaces.msg import Leader

from ..io.auth import leader_mac
from .claims import INSTANCE, ClaimCheck, authentic, claimants, outranks_claim, same_claimant, well_formed
from .lease import HeartbeatLease
from .slow_publish import SLOW_PUBLISH_MS

LEADER_TOPIC = "flashrt_leader"
LEASE_TOPIC = "flashrt_lease"
LEASE_MARGIN = 0.25  # of the lease: the leader stops this much before it, a standby waits this much after it
LEASE_RENEW = 0.1  # of the lease: how often the lease thread renews (a late wake-up leaves it 0.65 lease of slack)
# After a stall past its lease: how long a leader listens for a newer claim after renewing, before it resumes.
# A standby decides before it hears the renewal, and its claim lands within the delivery bound (docs/leadership.md).
REPROVE_LEASES = 1.0
# A primary's first claim: held until this long after its first observation arrived (and after the claim), so a
# node of the same name that already leads (a launch file started twice) is heard first: discovery of the
# sensor and of that node run side by side. While another process of this name renews a lease, the hold goes on.
START_HOLD_S = 1.0
# ... and at least this long after its claim: the sensor's discovery and the namesake's do not run side by side
# (Jazzy, loaded: the first observation came at once, the namesake's claim 1.8 s after activation).
START_DISCOVERY_S = 3.0
CLAIM_CHECK_S = 0.1  # claims waiting for their node to show in the graph are looked at again this often


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


def sibling_topic(topic: str, name: str) -> str:
    return f"{topic.rsplit('/', 1)[0]}/{name}" if "/" in topic else name


class LeaderGuard:
    def __init__(self, node, topic: str, on_deposed: Callable[[Leader], None], lease_ms: float = 100.0,
                 on_proven: Callable[[], None] = lambda: None, key: bytes | None = None):
        """``on_proven()``: the lease is current again after a hold (executor thread): publish what was held.
        ``key``: claims (ours and theirs) are signed and checked with it (io/auth.py); None: the no-key rules."""
        self.node, self.on_deposed, self.on_proven, self.key = node, on_deposed, on_proven, key
        self.name = node.get_fully_qualified_name()
        self.epoch = 0  # 0: not claimed
        self.newest_seen = 0  # the newest epoch any node claimed
        self._claimer: threading.Thread | None = None
        self.lease_s = lease_ms / 1e3
        self.margin_s = LEASE_MARGIN * self.lease_s
        self.holding = False  # the lease lapsed (or was never proven): outputs wait for a clean check
        self.holds = 0  # holds begun (a stall past lease - margin, or the start)
        self.heard: dict[str, float] = {}  # node -> monotonic time its newest heartbeat arrived
        self._hold_timers: list = []
        self._claim: Leader | None = None
        self._starting = False  # the start hold: ends START_HOLD_S after the first observation (observed())
        self._namesake_at = -math.inf  # when a heartbeat of this name from another process last arrived
        self._first_observation = 0.0
        self.pub = node.create_publisher(Leader, topic, leader_qos())
        self.check = ClaimCheck(node, self.pub.topic_name)
        self.sub = node.create_subscription(Leader, topic, self._on_leader, leader_qos(READER_DEPTH))
        lease_topic = sibling_topic(topic, LEASE_TOPIC)
        self.lease_pub = node.create_publisher(Leader, lease_topic, lease_qos())
        self.lease_sub = node.create_subscription(Leader, lease_topic, self._on_heartbeat, lease_qos())
        self.lease = HeartbeatLease(self._heartbeat, self.lease_s, self.margin_s, LEASE_RENEW * self.lease_s,
                                    self._heartbeat_failed)
        self._checker = node.create_timer(CLAIM_CHECK_S, self._check_due)

    def claim(self, epoch: int, step: int, capsule_id: int, hold_s: float = 0.0) -> None:
        """``hold_s``: publish nothing for that long (at least), listening for a newer claim (a primary's start)."""
        now = self.node.get_clock().now()
        self.epoch = epoch
        self.newest_seen = max(self.newest_seen, epoch)
        msg = Leader(stamp=now.to_msg(), epoch=epoch, node=self.name, step=step, capsule_id=capsule_id,
                     instance=INSTANCE)
        if self.key is not None:
            msg.mac = leader_mac(self.key, msg)
        self._claim = msg
        self.lease.start(time.monotonic())
        # From a thread of its own: after a kill -9 the dead primary's reader of this topic is still matched, and
        # a send to its shared-memory port can wait out Fast DDS's health check (1 s) inside publish; the
        # takeover's held steps and first actions must not wait behind it (the claim's order vs them is free:
        # a deposed node learns of the claim whenever it lands).
        self._claimer = threading.Thread(target=self._publish, args=(msg,), name="flashrt_leader_claim", daemon=True)
        self._claimer.start()
        if hold_s > 0:
            self._starting, self._first_observation = True, 0.0
            self._hold(hold_s, "")

    @property
    def starting(self) -> bool:
        """In a primary's start hold (a namesake may lead)."""
        return self._starting

    def observed(self) -> None:
        """An observation or a step's output waits (executor thread): the start hold counts from the first."""
        if self._starting and not self._first_observation:
            self._first_observation = time.monotonic()

    def _namesake_leads(self) -> bool:
        """Another process of this node's name renewed a lease within lease + margin."""
        return time.monotonic() - self._namesake_at < self.lease_s + self.margin_s

    # ---- the lease ------------------------------------------------------------------------
    def current(self) -> bool:
        """This node leads and may publish now: its lease is proven and no stall is unchecked."""
        return bool(self.epoch) and not self.holding and self.lease.current()

    def check_lease(self) -> None:
        """Executor thread, at an output or observation that found the lease not current: a lapse starts a hold.
        While no other node reads the heartbeats (no standby, no namesake: none can take over on their silence)
        the hold is one executor pass, renewing: a loaded machine's late renewals cost no steps."""
        if not self.epoch or self.holding or not self.lease.take_lapse():
            return
        if not self._heard_by_others():
            self._hold(0.0, "")
            return
        self._hold(REPROVE_LEASES * self.lease_s,
                   f"lease lapsed (this process stood still past lease - margin, "
                   f"{(self.lease_s - self.margin_s) * 1e3:.0f} ms): holding outputs and observations while "
                   "checking that no newer leader exists")

    def _heard_by_others(self) -> bool:
        return len(self.node.get_subscriptions_info_by_topic(self.lease_pub.topic_name)) > 1  # ours, and others

    def _heartbeat(self) -> None:
        if self._claim is not None:
            self.lease_pub.publish(self._claim)

    def _heartbeat_failed(self, e: Exception) -> None:
        self.node.get_logger().warning(f"lease not renewed: {e}", throttle_duration_sec=1.0)

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
        self.lease.renew()
        if self.lease.take_lapse() and self._heard_by_others():  # stood still again while holding: check once more
            self._hold(REPROVE_LEASES * self.lease_s, "lease lapsed again while holding: checking once more")
            return
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
        if same_claimant(msg, self.name, INSTANCE) or not authentic(self.node, msg, self.key):
            return  # our own, or forged
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

    def _check_due(self) -> None:
        for msg in self.check.due():
            self._on_leader(msg, checked=True)

    def _on_leader(self, msg: Leader, checked: bool = False) -> None:
        if not well_formed(self.node, msg) or same_claimant(msg, self.name, INSTANCE):
            return
        if not authentic(self.node, msg, self.key):
            return
        if not checked and self.key is None and not self.check.admit(msg, self.newest_seen):
            return
        self.newest_seen = max(self.newest_seen, msg.epoch)
        # another process of this name (a launch file started twice) is another claimant: the earlier claim wins
        if self.epoch and self._claim is not None and outranks_claim(msg, self._claim):
            self.epoch = 0
            self.holding = False
            self._cancel_hold()
            self.lease.stop()
            self.on_deposed(msg)

    def destroy(self) -> None:
        self.epoch = 0
        self._cancel_hold()
        self.lease.stop()
        self.node.destroy_timer(self._checker)
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
        self._checker = node.create_timer(CLAIM_CHECK_S, self._check_due)

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
        if best is not None and best.node != msg.node and best.node not in claimants(self.node, self.topic):
            best = None  # its node is gone (a restarted primary claims epoch 1 again after the standby died)
        if best is not None and not outranks_claim(msg, best):
            return
        self.best = msg
        if msg.node != self.following:
            self.following = msg.node
            self.on_new_leader(msg)

    def destroy(self) -> None:
        self.node.destroy_timer(self._checker)
        self.node.destroy_subscription(self.sub)
