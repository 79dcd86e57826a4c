"""The replica role (issue 18): a node that rebuilds the primary's capsule store from its
``<primary>/capsule_stream`` (runtime/persist/replica.py validates and applies each record) and serves
list_capsules, export_capsule and replan goals from it. A committing replan runs here as a what-if, and
its branch is forwarded to the primary, which re-runs and commits it (forward_commit). Services that would
change the robot's state (snapshot, rollback, drop, pins, import, reset) are refused with the name of the
primary to call instead.

A refused record or a gap in the sequence asks the primary for a resync (at most every RESYNC_ASK_S).
The lag (primary step stamp to capsule held here, same clock on one machine) goes on /diagnostics.
"""
from __future__ import annotations

import threading
import time

import numpy as np
from std_srvs.srv import Trigger

from flashrt_interfaces.msg import CapsuleRecord

from ...runtime.persist.replica import LOCAL_IDS_FROM, MAX_EPOCH, RecordRefused, StreamReplica
from ..io.auth import record_mac, valid
from .leader import LEADER_TOPIC, LeaderWatch
from .stream import stream_qos

RESYNC_ASK_S = 0.5
GID_BYTES = 16  # a DDS GUID: what rmw's gids hold (some pad them to 24 bytes)
LAG_EDGES_MS = (1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 80, 100, 150, 200, 500, 1000)  # + one bucket past the last
REPLICA_SERVICES = ("list_capsules", "export_capsule")  # the read-only ones a replica serves


def replica_refusal(primary: str, what: str) -> str:
    return (f"this node is a replica of {primary}: it serves list_capsules, export_capsule and replans (a commit "
            f"is forwarded to the primary); {what} changes the robot's state: call {primary} instead")


class ReplicaLink:
    def __init__(self, node, session, primary: str, qos=None, event_callbacks=None, follow_leader: bool = False,
                 thread_safe_actions: bool = True):
        self.node, self.primary = node, primary
        self._thread_safe_actions = thread_safe_actions  # the client that forwards commits (client/action_client.py)
        self.replica = StreamReplica(session)
        self.replica.on_cut = self._on_cut
        self.replica.on_new_run = self._on_new_run
        self.epoch = 0  # the newest epoch the primary's records carried
        self._lock = threading.Lock()  # the replica's counters: executor (records) vs diagnostics
        self._asked_at = -1e9
        self._lags: list[float] = []  # ms, since the last diagnostics
        self._qos, self._event_callbacks = qos or stream_qos(), event_callbacks
        self._retired = None  # the previous leader's client, after a switch
        self._connect(primary)
        # while it waits for a keyframe: ask again on a timer, not only when a record comes (the resync service
        # may not be discovered yet when the first records are skipped, right after activation)
        self._asker = node.create_timer(RESYNC_ASK_S, self._ask_if_waiting)
        # a replica follows whoever leads the robot: after a failover the standby's stream, not the dead primary's
        self.key = session.capsule_hmac_key  # records (and claims) must carry its MAC (io/auth.py); None: no key
        self.watch = (LeaderWatch(node, f"{primary.rsplit('/', 1)[0]}/{LEADER_TOPIC}", primary, self._follow,
                                  self.key) if follow_leader else None)

    def _connect(self, primary: str) -> None:
        """The stream, the resync service and (for forwarded commits) the services and action of ``primary``."""
        from ..client.api import FlashRTClient

        made = []
        try:
            made.append(FlashRTClient(self.node, primary.rsplit("/", 1)[0], self._thread_safe_actions))
            made.append(self.node.create_client(Trigger, f"{primary}/capsule_stream/resync"))
            # two parameters: rclpy hands the message's info too, which names its writer
            made.append(self.node.create_subscription(CapsuleRecord, f"{primary}/capsule_stream",
                                                      lambda msg, info: self._on_record_from(msg, info),
                                                      self._qos, event_callbacks=self._event_callbacks))
        except BaseException:
            self._release(*made)
            raise
        self.primary, (self.primary_client, self.client, self.sub) = primary, made
        self._writers: dict[bytes, bool] = {}  # writer gid -> whether the graph names it the followed leader's

    def _release(self, primary_client=None, resync=None, sub=None) -> None:
        if sub is not None:
            self.node.destroy_subscription(sub)
        if resync is not None:
            self.node.destroy_client(resync)
        if primary_client is not None:
            primary_client.destroy()

    def _follow(self, claim) -> bool:
        """Another node claimed the robot (executor thread): rebuild from its stream, keeping the timeline it
        inherited (up to claim.capsule_id); what the old leader recorded after that goes once the new stream's
        first record passed its checks. False: not followed (logged), the old stream kept."""
        was, old = self.primary, (self.primary_client, self.client, self.sub)
        try:
            self._connect(claim.node)
        except Exception as e:  # noqa: BLE001 - a claim is outside input: stay with the stream we had
            self.node.get_logger().error(f"leader claim of {claim.node!r} not followed: {type(e).__name__}: {e}")
            return False
        self._release(resync=old[1], sub=old[2])
        if self._retired is not None:
            self._retired.destroy()
        self._retired = old[0]  # a forwarded commit may still wait on it (the replan worker)
        self.replica.new_source(claim.capsule_id, claim.epoch)
        self._asked_at = -1e9
        self.node.get_logger().warning(
            f"{claim.node} leads the robot since epoch {claim.epoch} (it continued from capsule {claim.capsule_id}): "
            f"following its capsule stream instead of {was}'s")
        return True

    def _on_cut(self, after: int, gone: list[int]) -> None:
        self.node.get_logger().warning(f"{self.primary}'s stream checked: dropped the {len(gone)} capsules the old "
                                       f"leader recorded after capsule {after}")

    def _on_new_run(self, old: int, new: int, gone: list[int]) -> None:
        self.node.get_logger().warning(f"{self.primary} streams another run (timeline {new:#x}, was {old:#x}: it "
                                       f"restarted without persist_dir, or another node took its name): dropped "
                                       f"the {len(gone)} capsules held; starting over from its keyframe")

    def _on_record_from(self, msg, info) -> None:
        """Without a key, a record from a writer the graph shows under another node than the followed leader is
        dropped before anything looks at it: its capsule ids, and the silence it would hide (issue 44.3)."""
        if self.key is None and not self._from_leader(info):
            self.node.get_logger().error(f"capsule record {msg.seq} on {self.sub.topic_name} ignored: its writer "
                                         f"belongs to another node than {self.primary}", throttle_duration_sec=1.0)
            return
        self._on_record(msg)

    def _from_leader(self, info) -> bool:
        gid = bytes(((info or {}).get("publisher_gid") or {}).get("data") or b"")[:GID_BYTES]
        if not gid:  # an rmw that does not say
            return True
        if gid not in self._writers:
            for w in self.node.get_publishers_info_by_topic(self.sub.topic_name):
                self._writers[bytes(w.endpoint_gid)[:GID_BYTES]] = \
                    f"{w.node_namespace.rstrip('/')}/{w.node_name}" == self.primary
        return self._writers.get(gid, True)  # not in the graph yet (discovery lags data): taken, as before

    def _on_record(self, msg) -> None:
        try:
            if not 1 <= msg.epoch <= MAX_EPOCH:  # a standby's takeover takes the epoch after it
                raise RecordRefused(f"epoch {msg.epoch} outside 1..{MAX_EPOCH}")
            if not valid(self.key, msg, record_mac):  # before anything is decoded: a forged keyframe changes nothing
                raise RecordRefused("no valid HMAC under capsule_hmac_key_file's key")
            applied = self.replica.apply(msg.seq, msg.fingerprint, msg.record.tobytes(), msg.timeline)
        except RecordRefused as e:
            self.node.get_logger().error(f"capsule record {msg.seq} from {self.primary} refused: {e}",
                                         throttle_duration_sec=1.0)
            applied = False
        if applied:  # only a record it applied says which term the primary is in (a refused one may be forged)
            self.epoch = max(self.epoch, msg.epoch)
            lag = time.time() * 1e3 - (msg.stamp.sec * 1e3 + msg.stamp.nanosec / 1e6)
            with self._lock:
                self._lags.append(lag)
                del self._lags[:-1000]
        else:
            self._ask()

    def _ask_if_waiting(self) -> None:
        if self.replica.waiting:  # nothing applied yet, or the chain broke: records may not even come (idle robot)
            self._ask()

    def _ask(self) -> None:
        if time.monotonic() - self._asked_at >= RESYNC_ASK_S and self.client.service_is_ready():
            self._asked_at = time.monotonic()
            self.client.call_async(Trigger.Request())

    def lag_ms(self) -> list[float]:
        """The lags since the last call (ms), and forgets them."""
        with self._lock:
            lags, self._lags = self._lags, []
        return lags

    def stats(self):
        return self.replica.stats()

    def forward_commit(self, capsule_id: int, run: int, observations, deadline_ms: float, timeout_s: float):
        """A committing replan's branch, sent to the primary as a one-branch replan from the same capsule
        that commits it: the primary re-runs it (byte-identical by batch invariance) and no state travels
        back. ``run``: the timeline the what-if ran in. Worker thread; the node's executor delivers the answer.
        Returns the primary's ReplanOutcome."""
        if not capsule_id:  # 0 is the primary's live state, not what the what-if ran from
            raise ValueError("a forwarded commit names the capsule its what-if ran from, never 0")
        if capsule_id >= LOCAL_IDS_FROM:
            raise ValueError(f"capsule {capsule_id} is a what-if of this replica: the primary does not hold it; "
                             "commit from one of the primary's capsules")
        if run != self.replica.timeline:
            raise ValueError(f"{self.primary} started another run since this replan began (it restarted without "
                             f"persist_dir): its capsule {capsule_id} is not the one the what-if ran from")
        client = self.primary_client  # one leader for the whole call, whatever a switch does meanwhile
        return client.replan(observations[None], capsule_id=capsule_id, commit_branch=0, deadline_ms=deadline_ms,
                             timeout_s=timeout_s)

    def destroy(self) -> None:
        self.node.destroy_timer(self._asker)
        if self.watch is not None:
            self.watch.destroy()
        self._release(self.primary_client, self.client, self.sub)
        if self._retired is not None:
            self._retired.destroy()


def role_diagnostics(role: str, stream, link: ReplicaLink | None, leader=None, deposed: str = "") -> tuple[dict, str]:
    """/diagnostics values of the capsule stream (primary) or of the replica, and a warning ("" = none)."""
    values: dict = {"role": role}
    if leader is not None:
        values.update(leader_epoch=leader.epoch, newest_epoch_seen=leader.newest_seen)
    if deposed:
        return values, deposed
    if stream is not None:
        st = stream.stats()
        values.update(stream_records=st.records_published, stream_keyframes=st.keyframes_published,
                      stream_dropped=st.records_dropped, stream_lag_ms=f"{st.lag_ms:.1f}", stream_seq=st.seq)
        if st.last_error:
            values["stream_last_error"] = st.last_error
    if link is None:
        return values, ""
    st, lags = link.stats(), sorted(link.lag_ms())

    def at(q: float) -> float:
        return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else 0.0
    # since the last diagnostics: the primary's step (its observation's stamp) to the capsule held here
    # the period's lags binned (counts per bucket, upper edges LAG_EDGES_MS): summed over periods, a tool gets a
    # percentile over every record instead of a percentile of percentiles
    hist = np.bincount(np.searchsorted(LAG_EDGES_MS, lags), minlength=len(LAG_EDGES_MS) + 1) if lags else []
    values.update(primary=link.primary, replica_applied=st.applied, replica_refused=st.refused,
                  replica_gaps=st.gaps, replica_skipped=st.skipped, replica_capsule_id=st.last_id,
                  replica_step=st.last_step, replica_lag_samples=len(lags), replica_lag_ms_p50=f"{at(0.5):.2f}",
                  replica_lag_ms_p99=f"{at(0.99):.2f}", replica_lag_ms_max=f"{at(1.0):.2f}",
                  replica_lag_ms_hist=",".join(str(int(c)) for c in hist))
    if st.last_error:
        values["replica_last_error"] = st.last_error
    if hasattr(link, "buffer"):  # a standby
        values.update(standby_held_observations=len(link.pending()), standby_buffer_overflowed=link.buffer.overflowed)
    warn = ""
    if st.waiting_for_keyframe:
        warn = (f"replica: waiting for a keyframe from {link.primary}" if st.applied
                else f"replica: nothing received from {link.primary} yet")
    return values, warn
