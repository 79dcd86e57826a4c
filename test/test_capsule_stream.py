"""The capsule stream and a replica rebuilt from it, without ROS (issue 18, points 1 and 2): every record a
primary publishes rebuilds, on the replica, the same capsules byte for byte; keyframes let a late replica
start; a gap, a forged or damaged record, or another fingerprint is refused without touching the replica."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from persist_fixtures import cfg

from conftest import CPU_BACKENDS, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.format import DELTA, LIVE, RESET, RESYNC
from flashrt_ros.runtime.persist.replica import LOCAL_IDS_FROM, RecordRefused, StreamReplica, epoch_ids

OBS = observation_trace(400)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self, info) -> float:
        return self.t


def streaming(backend="numpy", keyframe_s=10.0, clock=None, **kw):
    s = Session(cfg(**kw), backend)
    records = []
    stream = s.enable_stream(records.append, keyframe_s=keyframe_s, clock=clock)
    return s, stream, records


def replica_of(s) -> tuple[Session, StreamReplica]:
    r = Session(s.cfg, s.backend.name)
    return r, StreamReplica(r)


def stepped(n: int, **kw):
    """A streaming primary after ``n`` steps, every record published, and a fresh replica of it."""
    s, stream, records = streaming(**kw)
    for o in OBS[:n]:
        s.step(o)
    assert stream.flush()
    return (s, stream, records, *replica_of(s))


def feed(replica: StreamReplica, records) -> list[bool]:
    return [replica.apply(rec.seq, replica.session.fingerprint, rec.blob, rec.timeline) for rec in records]


def assert_same_capsules(r: Session, s: Session) -> None:
    held = [i.id for i in r.list_capsules()]
    assert held, "the replica holds no capsule"
    for cid in held:
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid
        assert r.capsule_info(cid).step == s.capsule_info(cid).step


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_replica_fed_the_stream_holds_every_capsule_byte_exactly_through_rollbacks_and_a_wrapped_window(backend):
    s, stream, records = streaming(backend)
    for o in OBS[:170]:  # past kv_window 150: the window wraps
        s.step(o)
    back = s.rollback(steps_back=30)
    for o in OBS[200:240]:
        s.step(o)
    s.replan(back.id, np.stack([OBS[300:305], OBS[305:310]]), commit_branch=1)
    for o in OBS[240:260]:
        s.step(o)
    assert stream.flush()
    kinds = [rec.kind for rec in records]
    assert kinds[0] == RESYNC and LIVE in kinds and kinds.count(DELTA) > 200
    r, replica = replica_of(s)
    assert all(feed(replica, records))
    assert_same_capsules(r, s)
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert r.live_capsule_id == s.live_capsule_id and r.step_count == s.step_count
    assert replica.stats().refused == replica.stats().gaps == 0


def test_a_replica_what_if_is_byte_identical_to_the_primarys_from_the_same_capsule():
    s, stream, records = streaming("cpu")
    for o in OBS[:120]:
        s.step(o)
    assert stream.flush()
    r, replica = replica_of(s)
    feed(replica, records)
    base = s.list_capsules()[-40].id
    plan = np.stack([OBS[200:208] + 0.1 * b for b in range(4)])
    mine, theirs = r.replan(base, plan), s.replan(base, plan)
    assert mine.actions.tobytes() == theirs.actions.tobytes()
    assert min(mine.branch_capsule_ids) >= LOCAL_IDS_FROM  # never an id the primary hands out next
    for o in OBS[120:125]:  # and the stream goes on after the replica's own capsules
        s.step(o)
    assert stream.flush()
    feed(replica, records[-5:])
    assert_same_capsules(r, s)


def test_a_late_replica_starts_at_the_next_keyframe_and_skips_the_deltas_before_it():
    clock = Clock()
    s, stream, records = streaming(keyframe_s=1.0, clock=clock)
    for i, o in enumerate(OBS[:60]):
        clock.t = i * 0.05  # 20 Hz: a keyframe every 20 steps
        s.step(o)
        assert stream.flush()
    kinds = [rec.kind for rec in records]
    assert [i for i, k in enumerate(kinds) if k == RESYNC] == [0, 20, 40]
    r, replica = replica_of(s)
    applied = feed(replica, records[5:])  # joins at step 6
    assert applied == [False] * 15 + [True] * 40
    assert replica.stats().skipped == 15
    assert_same_capsules(r, s)
    assert min(i.step for i in r.list_capsules()) == 21


def test_a_resync_request_on_an_idle_primary_resends_the_live_capsule_at_once():
    s, stream, records = streaming()
    for o in OBS[:30]:
        s.step(o)
    s.rollback(steps_back=10)
    assert stream.flush()
    n = len(records)
    assert stream.request_resync()
    assert not stream.request_resync()  # a client asking in a loop gets one resend per RESEND_MIN_S
    assert stream.flush()
    resent = records[n:]
    assert [(rec.kind, rec.capsule_id) for rec in resent] == [(RESYNC, s.live_capsule_id)]
    r, replica = replica_of(s)
    assert feed(replica, resent) == [True]
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert r.live_capsule_id == s.live_capsule_id


def test_a_gap_in_the_sequence_makes_the_replica_wait_for_the_next_resync():
    s, stream, records, r, replica = stepped(20)
    feed(replica, records[:10])
    before = r.state_host().tobytes()
    assert feed(replica, records[11:15]) == [False] * 4  # record 11 lost
    assert r.state_host().tobytes() == before and replica.stats().gaps == 1
    assert stream.request_resync()
    assert stream.flush()
    assert feed(replica, records[-1:]) == [True]
    assert r.state_host().tobytes() == s.state_host().tobytes()


def _flip(blob: bytes, at: int) -> bytes:
    b = bytearray(blob)
    b[at] ^= 0x40
    return bytes(b)


def _reforged(blob: bytes, edit) -> bytes:
    """The record with ``edit(payload)`` applied and its checksum made valid again: a forgery, not damage."""
    import zlib
    head = struct.Struct("<4sB3xII")
    magic, kind, n, _ = head.unpack_from(blob, 0)
    payload = bytearray(blob[head.size:])
    edit(payload)
    crc = zlib.crc32(bytes(payload), zlib.crc32(struct.pack("<BI", kind, n)))
    return head.pack(magic, kind, n, crc) + bytes(payload)


def _forged_delta(blob: bytes, value: float) -> bytes:
    """A DELTA whose last KV float is ``value``."""
    return _reforged(blob, lambda p: p.__setitem__(slice(-4, None), struct.pack("<f", value)))


def _forged_id(blob: bytes, cid: int) -> bytes:
    return _reforged(blob, lambda p: struct.pack_into("<Q", p, 0, cid))


@pytest.mark.parametrize("attack", ["flipped_byte", "truncated", "trailing", "non_finite", "huge", "wrong_fp",
                                    "out_of_chain", "local_id", "no_timeline"])
def test_a_bad_record_is_refused_and_leaves_the_replica_byte_identical(attack):
    s, stream, records, r, replica = stepped(25)
    feed(replica, records[:20])
    good = records[20]
    fp, seq, blob, timeline = r.fingerprint, good.seq, good.blob, good.timeline
    if attack == "flipped_byte":
        blob = _flip(blob, len(blob) // 2)
    elif attack == "truncated":
        blob = blob[:-7]
    elif attack == "trailing":
        blob = blob + b"\0"
    elif attack == "non_finite":
        blob = _forged_delta(blob, float("nan"))
    elif attack == "huge":
        blob = _forged_delta(blob, 3e38)
    elif attack == "wrong_fp":
        fp = "0" * 64
    elif attack == "out_of_chain":
        blob, seq = records[22].blob, good.seq  # step 23 where step 21 is due
    elif attack == "local_id":
        blob = _forged_id(blob, LOCAL_IDS_FROM + 5)
    elif attack == "no_timeline":
        timeline = 0
    state, capsules = r.state_host().tobytes(), [(i.id, i.step) for i in r.list_capsules()]
    with pytest.raises(RecordRefused):
        replica.apply(seq, fp, blob, timeline)
    assert r.state_host().tobytes() == state
    assert [(i.id, i.step) for i in r.list_capsules()] == capsules
    assert replica.stats().refused == 1 and replica.stats().waiting_for_keyframe


def test_a_reset_on_the_primary_resets_the_replica_and_the_next_capsule_stands_alone():
    s, stream, records = streaming()
    for o in OBS[:15]:
        s.step(o)
    s.reset()
    for o in OBS[100:110]:
        s.step(o)
    assert stream.flush()
    kinds = [rec.kind for rec in records]
    assert kinds[15] == RESET and kinds[16] == RESYNC
    r, replica = replica_of(s)
    assert all(feed(replica, records))
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert_same_capsules(r, s)


def _taken_over(s, records, through_id: int, held: np.ndarray, epoch: int = 2, what_if: bool = False):
    """A standby that heard the stream up to capsule ``through_id``, then took over at ``epoch`` (as GroupRole
    does, ros/group/roles.py): restores that capsule, numbers in its epoch's ids, steps the observations it held,
    streams."""
    sb, standby = replica_of(s)
    feed(standby, [rec for rec in records if rec.capsule_id <= through_id])
    if what_if:  # a what-if served while it stood by: its id is every replica's what-if id
        sb.replan(through_id, np.stack([OBS[200:202]]))
    sb.rollback(standby.last.id)
    standby.lead(epoch)
    for o in held:
        sb.step(o)
    new_records = []
    stream = sb.enable_stream(new_records.append, keyframe_s=10.0)
    for o in OBS[300:302]:
        sb.step(o)
    assert stream.flush()
    return sb, new_records


E2 = epoch_ids(2)[0]


def test_a_replica_that_follows_a_new_leader_drops_what_the_old_one_recorded_after_the_takeover_point():
    """The standby heard the primary up to capsule 30 and stepped other observations after it (the primary's
    31-40 were lost on the way). Its capsules take its epoch's ids, and a replica that held the old 31-40 drops
    them: they are not in the new leader's timeline."""
    s, stream, records, r, replica = stepped(40)
    assert all(feed(replica, records))
    sb, new_records = _taken_over(s, records, 30, OBS[100:105])
    # ids of epoch 2, after the 5 held steps; a whole window first (a new stream), then deltas
    assert [(rec.kind, rec.capsule_id) for rec in new_records] == [(RESYNC, E2 + 5), (DELTA, E2 + 6)]
    cuts = []
    replica.on_cut = lambda after, gone: cuts.append((after, gone))
    replica.new_source(30, 2)
    assert all(feed(replica, new_records))
    assert cuts == [(30, list(range(31, 41)))]
    assert_same_capsules(r, sb)
    assert r.state_host().tobytes() == sb.state_host().tobytes() and r.live_capsule_id == sb.live_capsule_id == E2 + 6


def test_a_claim_or_a_bad_record_from_the_new_leader_drops_nothing():
    """Anyone on the domain can claim the robot: the old leader's capsules go only once a record of the new
    stream passed every check. What the replica holds up to the takeover point, and its what-ifs, stay."""
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    mine = r.replan(20, np.stack([OBS[200:204]])).branch_capsule_ids  # a what-if of the replica's own
    before = {i.id: r.capsule_host(i.id).tobytes() for i in r.list_capsules()}
    sb, new_records = _taken_over(s, records, 30, OBS[100:105])
    replica.new_source(30, 2)
    with pytest.raises(RecordRefused):
        replica.apply(1, r.fingerprint, _flip(new_records[0].blob, 100), new_records[0].timeline)
    assert feed(replica, new_records[1:]) == [False]  # a delta before the keyframe: skipped
    assert {i.id: r.capsule_host(i.id).tobytes() for i in r.list_capsules()} == before
    assert replica.stats().waiting_for_keyframe
    assert feed(replica, new_records[:1]) == [True]
    held = {i.id for i in r.list_capsules()}
    assert set(mine) <= held and {i for i in held if i < LOCAL_IDS_FROM} == set(range(1, 31)) | {E2 + 5}
    assert all(r.capsule_host(cid).tobytes() == before[cid] for cid in [*range(1, 31), *mine])


def test_a_second_takeover_drops_the_first_new_leaders_capsules_and_a_rejoin_keeps_the_current_ones():
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    sb1, first = _taken_over(s, records, 28, OBS[100:103], epoch=2)
    replica.new_source(28, 2)
    assert all(feed(replica, first))
    sb2, second = _taken_over(s, records, 30, OBS[110:112], epoch=3)
    replica.new_source(30, 3)
    assert all(feed(replica, second))
    held = {i.id for i in r.list_capsules()}
    e3 = epoch_ids(3)[0]
    # 29 and 30 went with the first switch (the first new leader continued from 28), its own with the second
    assert held == set(range(1, 29)) | {e3 + 2, e3 + 3}
    assert_same_capsules(r, sb2)
    # a replica reactivated later hears the same claim again: the leader's own capsules stay
    replica.new_source(30, 3)
    assert all(feed(replica, second[:1]))
    assert {i.id for i in r.list_capsules()} == held


def test_a_standby_whose_new_leader_died_before_its_keyframe_continues_from_the_claim_byte_exactly():
    """A second standby followed the first that took over from capsule 30, and that one died before any record
    of it arrived: the second continues from capsule 30 (what the first continued from), drops the old
    primary's 31-40 when it leads, and stepping what the first stepped gives the first's bytes."""
    s, stream, records, r, second = stepped(40)
    feed(second, records)
    sb, new_records = _taken_over(s, records, 30, OBS[100:105])
    assert second.newest().id == 40
    second.new_source(30, 2)  # the claim; none of new_records arrives
    start = second.newest()
    assert (start.id, start.step, start.stamp_ns) == (30, s.capsule_info(30).step, s.capsule_info(30).stamp_ns)
    r.rollback(start.id)
    second.lead(3)
    assert {i.id for i in r.list_capsules()} == set(range(1, 31))
    for o in [*OBS[100:105], *OBS[300:302]]:
        r.step(o)
    assert r.state_host().tobytes() == sb.state_host().tobytes()
    second.new_source(99, 4)  # a claim naming a capsule it does not hold: nothing to continue from
    assert second.newest() is None


def test_a_new_leader_drops_its_what_ifs_and_a_replica_refuses_any_record_of_a_what_if_id():
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    mine = r.replan(20, np.stack([OBS[200:204]])).branch_capsule_ids
    sb, new_records = _taken_over(s, records, 30, OBS[100:102], what_if=True)
    assert all(i.id < LOCAL_IDS_FROM for i in sb.list_capsules())
    forged = _forged_id(new_records[0].blob, mine[0])  # a leader's record naming an id the replica holds as its own
    before = r.capsule_host(mine[0]).tobytes()
    replica.new_source(30, 2)
    with pytest.raises(RecordRefused, match="below"):
        replica.apply(1, r.fingerprint, forged, new_records[0].timeline)
    assert r.capsule_host(mine[0]).tobytes() == before


def test_the_stream_is_off_the_step_thread_and_drops_nothing_at_a_slow_subscriber():
    """A publish that blocks (a slow DDS peer) never holds up a step: the records queue, none is lost."""
    import threading
    gate = threading.Event()
    s = Session(cfg())
    got = []

    def slow(rec):
        gate.wait(5)
        got.append(rec)
    stream = s.enable_stream(slow)
    for o in OBS[:50]:
        s.step(o)
    assert len(got) == 0  # nothing published while the steps ran: they did not wait for it
    gate.set()
    assert stream.flush()
    assert len(got) == 50 and stream.stats().records_dropped == 0


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_resync_records_queued_behind_a_blocked_subscriber_each_keep_their_own_window(backend):
    """More whole-window records than the spare buffers wait behind a publish that blocks: each goes out with the
    window of its own capsule (a buffer goes back for reuse only once its record is published)."""
    import threading
    gate = threading.Event()
    s = Session(cfg(), backend)
    records = []

    def slow(rec):
        gate.wait(5)
        records.append(rec)
    stream = s.enable_stream(slow)
    for o in OBS[:170]:  # past kv_window 150: every record after a rollback holds a wrapped window
        s.step(o)
    at = 170
    for back in (7, 19, 3, 11):  # four RESYNCs, two spare buffers: the queue holds them all at once
        s.rollback(steps_back=back)
        for o in OBS[at:at + 2]:
            s.step(o)
        at += 2
    gate.set()
    assert stream.flush()
    assert [rec.kind for rec in records].count(RESYNC) >= 5
    r, replica = replica_of(s)
    assert all(feed(replica, records))
    assert_same_capsules(r, s)
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_a_resync_after_a_rollback_reuses_a_spare_window_buffer_the_stream_gave_back():
    s, stream, records = streaming()
    for o in OBS[:40]:
        s.step(o)
    assert stream.flush()
    spares = {id(b) for b in stream.log._spare_windows}
    assert len(spares) == 2
    for back in (5, 9, 2):
        s.rollback(steps_back=back)
        s.step(OBS[40 + back])
        assert stream.flush()
        # the record's buffer came from the spares and went back to them: no new 4 MiB block per rollback
        assert {id(b) for b in stream.log._spare_windows} == spares
    assert [rec.kind for rec in records].count(RESYNC) == 4
