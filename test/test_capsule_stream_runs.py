"""Capsule ids are unique within one run (timeline) only: a replica of a primary that restarted without
persist_dir must not take the new run's capsule 30 for the old one it holds. A resumed primary keeps its
timeline, so its replicas keep what they hold; a standby that takes over streams under the one it followed."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from persist_fixtures import settings
from test_capsule_stream import OBS, _flip, assert_same_capsules, feed, replica_of, stepped, streaming

from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.format import DELTA, LIVE, RESYNC, TIMELINE_NAME, read_timeline
from flashrt_ros.runtime.persist.replica import RecordRefused, StreamReplica


def _held(r: Session) -> dict[int, bytes]:
    return {i.id: r.capsule_host(i.id).tobytes() for i in r.list_capsules()}


def test_a_primary_restarted_without_persist_dir_is_a_new_run_and_its_replica_drops_the_old_one():
    s, stream, records, r, replica = stepped(40)
    assert all(feed(replica, records))
    mine = r.replan(20, np.stack([OBS[200:204]])).branch_capsule_ids  # a what-if branched from the old run
    runs = []
    replica.on_new_run = lambda old, new, gone: runs.append((old, new, gone))
    s2, stream2, records2 = streaming()  # the restart: ids from 1 again, other observations
    for o in OBS[100:130]:
        s2.step(o)
    assert stream2.flush()
    assert s2.timeline != s.timeline and records2[29].capsule_id == 30
    old30 = r.capsule_host(30).tobytes()
    assert old30 != s2.capsule_host(30).tobytes()  # the same id, another state
    before = _held(r)
    # the new run's deltas, then a damaged keyframe of it: nothing held changes
    assert feed(replica, records2[1:4]) == [False] * 3
    assert stream2.request_resync()
    assert stream2.flush()
    keyframe = records2[-1]
    assert keyframe.kind == RESYNC and keyframe.capsule_id == 30
    with pytest.raises(RecordRefused):
        replica.apply(keyframe.seq, r.fingerprint, _flip(keyframe.blob, 100), keyframe.timeline)
    assert _held(r) == before and not runs
    # its keyframe starts the new run on the replica: the old capsules and what-ifs go
    assert feed(replica, [keyframe]) == [True]
    assert runs == [(s.timeline, s2.timeline, sorted(before))] and set(mine) <= set(before)
    for o in OBS[130:135]:
        s2.step(o)
    assert stream2.flush()
    assert [rec.kind for rec in records2[-5:]] == [DELTA] * 5
    assert all(feed(replica, records2[-5:]))
    assert set(_held(r)) == set(range(30, 36))
    assert_same_capsules(r, s2)
    assert r.state_host().tobytes() == s2.state_host().tobytes()
    assert replica.timeline == r.timeline == s2.timeline


def test_a_record_of_the_old_run_after_the_switch_is_refused_or_skipped_without_touching_the_new_one():
    s, stream, records, r, replica = stepped(20)
    feed(replica, records)
    s2, stream2, records2 = streaming()
    for o in OBS[100:110]:
        s2.step(o)
    assert stream2.flush()
    assert all(feed(replica, records2))
    held = _held(r)
    assert feed(replica, records[-3:]) == [False] * 3  # the old run's deltas: another run, no keyframe
    assert _held(r) == held and replica.timeline == s2.timeline


def test_a_resumed_primary_keeps_its_timeline_and_its_replica_keeps_what_it_holds(tmp_path):
    st = settings(tmp_path)
    s, stream, records = streaming()
    s.enable_persistence(st)
    for o in OBS[:25]:
        s.step(o)
    assert stream.flush()
    r, replica = replica_of(s)
    assert all(feed(replica, records))
    held = _held(r)
    s.disable_stream()
    s.disable_persistence()
    assert read_timeline(st.directory) == s.timeline
    s2, stream2, records2 = streaming()
    s2.enable_persistence(st, resume=True)
    assert s2.timeline == s.timeline
    for o in OBS[25:30]:
        s2.step(o)
    assert stream2.flush()
    assert all(feed(replica, records2))  # a new stream (a gap), a keyframe of the same run: nothing dropped
    after = _held(r)
    assert {cid: after[cid] for cid in held} == held and len(after) == len(held) + 5
    assert_same_capsules(r, s2)


def test_a_fresh_start_in_a_persist_dir_is_a_new_timeline_and_a_damaged_timeline_file_starts_one(tmp_path):
    st = settings(tmp_path)
    s = Session(streaming()[0].cfg)
    s.enable_persistence(st)
    s.step(OBS[0])
    s.disable_persistence()
    fresh = Session(s.cfg)
    fresh.enable_persistence(st, resume=False)
    assert fresh.timeline != s.timeline and read_timeline(st.directory) == fresh.timeline
    fresh.step(OBS[1])
    fresh.disable_persistence()
    (st.directory / TIMELINE_NAME).write_bytes(b"\0" * 20)
    resumed = Session(s.cfg)
    resumed.enable_persistence(st, resume=True)  # the log itself is sound: the resume goes on, in a new run
    assert resumed.timeline not in (s.timeline, fresh.timeline)
    assert read_timeline(st.directory) == resumed.timeline and resumed.step_count == 1
    resumed.disable_persistence()


def test_a_standby_that_takes_over_streams_under_the_timeline_it_followed():
    s, stream, records, sb, standby = stepped(20)
    assert all(feed(standby, records))
    assert sb.timeline == s.timeline
    sb.rollback(standby.last.id)
    standby.lead(2)
    out = []
    stream2 = sb.enable_stream(out.append, keyframe_s=10.0)
    sb.step(OBS[50])
    assert stream2.flush()
    assert [rec.timeline for rec in out] == [s.timeline]


def _restarted(n: int = 30):
    """A primary started again without persist_dir: ids from 1, other observations, its records flushed."""
    s2, stream2, records2 = streaming()
    for o in OBS[100:100 + n]:
        s2.step(o)
    assert stream2.flush()
    return s2, stream2, records2


def test_a_replica_reactivated_on_a_store_it_holds_still_drops_the_old_run_at_a_new_ones_keyframe():
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    again = StreamReplica(r)  # the node deactivated and activated: a new link on the same session and store
    s2, _, records2 = _restarted()
    assert records2[0].kind == RESYNC and records2[0].capsule_id == 1
    assert all(feed(again, records2))
    assert_same_capsules(r, s2)
    assert set(_held(r)) == set(range(1, 31))


def test_a_new_run_waits_for_a_running_replan_so_none_of_its_what_ifs_outlives_the_switch():
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    s2, _, records2 = _restarted()
    started, out = threading.Event(), {}

    def slow(done: int) -> None:
        started.set()
        time.sleep(0.05)

    t = threading.Thread(target=lambda: out.setdefault("res", r.replan(20, np.stack([OBS[200:206]] * 2),
                                                                        on_step=slow)))
    t.start()
    assert started.wait(10.0)
    assert all(feed(replica, records2[:1]))  # the keyframe waits for the replan, then drops its what-ifs too
    t.join(10.0)
    assert out["res"].steps_done == 6 and set(out["res"].branch_capsule_ids)
    assert set(_held(r)) == {1}


def test_records_keep_the_timeline_they_were_queued_in():
    gate = threading.Event()
    s = Session(streaming()[0].cfg)
    out = []
    stream = s.enable_stream(lambda rec: (gate.wait(10.0), out.append(rec)), keyframe_s=10.0)
    first = s.timeline
    for o in OBS[:3]:
        s.step(o)
    s.adopt_timeline(first ^ 1)  # as a resume does once the steps before it are queued
    s.step(OBS[3])
    gate.set()
    assert stream.flush()
    assert [rec.timeline for rec in out] == [first] * 3 + [first ^ 1]


def test_a_marker_of_another_run_after_a_leader_claim_cuts_nothing():
    s, stream, records, r, replica = stepped(40)
    feed(replica, records)
    before = _held(r)
    replica.new_source(30, 2)  # a claim: the cut waits for the new leader's first checked record
    s2, stream2, records2 = _restarted(10)
    s2.rollback(5)
    assert stream2.flush() and records2[-1].kind == LIVE
    assert feed(replica, records2[-1:]) == [False]
    assert _held(r) == before
