"""Persistence in one process: the capsule log on disk, resume byte-exact, torn tails, drops, retention."""
from __future__ import annotations

import numpy as np
import pytest
from persist_fixtures import cfg, settings

from conftest import CPU_BACKENDS, assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.errors import FingerprintMismatch
from flashrt_ros.runtime.persist.format import LogCorrupt, iter_segment_paths

OBS = observation_trace(700)



def run_mission(s: Session, obs=OBS) -> None:
    """Steps, a rollback, committed replans from the live state and from an older capsule, a pin, and more
    steps: every kind of record and every jump of the timeline."""
    for o in obs[:260]:
        s.step(o)
    s.rollback(steps_back=37)
    for o in obs[260:400]:
        s.step(o)
    s.replan(None, np.stack([obs[400:406], obs[406:412] * 0.5]), commit_branch=1)
    s.pin(s.list_capsules()[-3].id)
    for o in obs[412:500]:
        s.step(o)
    older = s.list_capsules()[-3]  # two steps back: a commit from it lands past the live step, on another window
    s.replan(older.id, obs[None, 500:505] * 0.9, commit_branch=0)
    for o in obs[500:600]:
        s.step(o)


@pytest.fixture(params=CPU_BACKENDS)
def persisted(tmp_path, request):
    s = Session(cfg(), backend=request.param)
    s.enable_persistence(settings(tmp_path))
    run_mission(s)
    assert s.persistence.flush()
    return s, tmp_path


def test_resume_restores_the_newest_capsule_byte_exactly_and_continues_identically(persisted):
    s, tmp_path = persisted
    st = s.persistence.stats()
    assert st.records_written == 260 + 140 + 1 + 88 + 1 + 100  # every timeline capsule: steps and committed branches
    assert st.records_dropped == 0 and st.write_errors == 0
    s.disable_persistence()
    r = Session(cfg(), backend=s.backend.name)
    report = r.enable_persistence(settings(tmp_path), resume=True)
    assert (report.capsule_id, report.step) == (s.live_capsule_id, s.step_count)
    assert report.records_cut == 0
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert r.capsule_host(s.live_capsule_id).tobytes() == s.capsule_host(s.live_capsule_id).tobytes()
    handed_out = s.store.next_id  # every id the crashed node gave a client is below it
    for o in OBS[600:]:
        a, b = s.step(o), r.step(o)
        assert a.action.tobytes() == b.action.tobytes() and b.capsule_id >= handed_out
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_every_restored_capsule_equals_the_original(persisted):
    s, tmp_path = persisted
    s.disable_persistence()  # one writer per persist_dir: the resume below takes its lock
    r = Session(cfg(), backend=s.backend.name)
    r.enable_persistence(settings(tmp_path), resume=True)
    restored = {i.id for i in r.list_capsules()}
    assert len(restored) > 50
    for info in s.list_capsules():
        if info.id in restored:
            assert r.capsule_host(info.id).tobytes() == s.capsule_host(info.id).tobytes(), info
    pinned = [i.id for i in s.list_capsules(pinned_only=True)]
    assert pinned and [i.id for i in r.list_capsules(pinned_only=True)] == pinned


def test_a_log_cut_at_every_byte_of_its_last_record_resumes_at_the_record_before(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:40]:
        s.step(o)
    s.disable_persistence()
    seg = list(iter_segment_paths(tmp_path / "log"))[-1]
    blob = seg.read_bytes()
    want = s.capsule_host(s.live_capsule_id - 1).tobytes()
    last_len = len(blob) - _record_offsets(s, seg)[-1]
    # every byte of the record's head and tail, every 13th in between: each field's cut is covered
    cuts = sorted(set(range(1, 65)) | set(range(last_len - 64, last_len)) | set(range(1, last_len, 13)))
    r = Session(cfg())
    for cut in cuts:
        seg.write_bytes(blob[:len(blob) - cut])
        report = r.enable_persistence(settings(tmp_path), resume=True)
        r.disable_persistence()
        assert (report.step, report.records_cut) == (39, 1), cut
        assert r.state_host().tobytes() == want


def _record_offsets(s, seg):
    from flashrt_ros.runtime.persist.attach import layout_of
    from flashrt_ros.runtime.persist.format import scan
    from flashrt_ros.runtime.persist.resume import meta_reader
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert err is None
    return [r.offset for r in recs]


def test_a_flipped_byte_in_the_last_record_is_cut_and_in_an_older_needed_segment_refused(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, segment_mb=0.31))  # the smallest: 4 whole-window records
    for o in OBS[:250]:
        s.step(o)
    s.disable_persistence()
    segs = list(iter_segment_paths(tmp_path / "log"))
    assert len(segs) >= 3
    last = segs[-1]
    offs = _record_offsets(s, last)
    blob = bytearray(last.read_bytes())
    blob[offs[-1] + 40] ^= 0x10
    last.write_bytes(bytes(blob))
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert report.records_cut == 1 and report.step == 249 and "checksum" in report.cut
    old = bytearray(segs[-2].read_bytes())  # resume reads it: the store keeps more records than one segment
    old[len(old) // 2] ^= 0x01
    segs[-2].write_bytes(bytes(old))
    r = Session(cfg())
    r.step(OBS[0])  # something to lose
    assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt,
                             f"{segs[-2].name}: offset \\d+")
    assert r.persistence is None


def test_a_log_of_another_fingerprint_is_refused_with_a_clear_message(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    s.step(OBS[0])
    s.disable_persistence()
    other = Session(cfg(seed=1))
    other.step(OBS[0])  # something to lose
    assert_refused_unchanged(other, lambda: other.enable_persistence(settings(tmp_path), resume=True),
                             FingerprintMismatch, "another config, weights or plan")
    assert other.persistence is None


def test_fresh_on_mismatch_moves_the_other_log_aside_under_the_lock_and_starts_fresh(tmp_path):
    from flashrt_ros.runtime.persist.attach import DirLock
    from flashrt_ros.runtime.persist.format import iter_segment_paths
    from flashrt_ros.runtime.persist.writer import PersistDirInUse
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    s.step(OBS[0])
    s.disable_persistence()
    old = sorted(p.name for p in iter_segment_paths(tmp_path / "log"))
    other = Session(cfg(seed=1))
    assert other.enable_persistence(settings(tmp_path), resume=True, fresh_on_mismatch=True) is None
    moved = other.persistence.mismatch_moved
    assert moved.parent == tmp_path / "log" and sorted(p.name for p in moved.iterdir()) == old
    with pytest.raises(PersistDirInUse, match="in use"):  # held from before the move until the node lets go
        DirLock(tmp_path / "log")
    other.step(OBS[1])
    other.disable_persistence()
    resumed = Session(cfg(seed=1))
    assert resumed.enable_persistence(settings(tmp_path), resume=True).capsule_id == other.live_capsule_id


def test_a_fresh_start_next_to_an_old_log_never_reuses_an_id(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:30]:
        s.step(o)
    s.disable_persistence()
    fresh = Session(cfg())
    fresh.enable_persistence(settings(tmp_path))  # resume off
    first = fresh.step(OBS[0]).capsule_id
    assert first > 30
    fresh.disable_persistence()
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    assert (report.capsule_id, report.step) == (first, 1)


def test_a_full_queue_drops_records_and_the_next_record_resynchronises(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    s.persistence.log._queue_cap = 0  # nothing fits: every record is dropped
    for o in OBS[:20]:
        s.step(o)
    assert s.persistence.stats().records_dropped == 20
    s.persistence.log._queue_cap = 1 << 30  # room again
    for o in OBS[20:30]:
        s.step(o)
    s.persistence.flush()
    st = s.persistence.stats()
    assert st.records_written == 10 and st.resyncs_written >= 1
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(settings(tmp_path), resume=True)
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_retention_keeps_the_log_within_its_budget_and_pins_longest(tmp_path):
    st = settings(tmp_path, segment_mb=0.35, budget_mb=1.0)
    s = Session(cfg())
    s.enable_persistence(st)
    s.step(OBS[0])
    s.pin(s.live_capsule_id)
    for o in OBS[1:400]:
        s.step(o)
    s.persistence.flush()
    stats = s.persistence.stats()
    assert stats.log_bytes <= 1.1 * 2**20  # the open segment may pass its size by a record
    assert stats.pins == 1 and len(list(iter_segment_paths(tmp_path / "log"))) < 400 * 12_000 / (0.35 * 2**20)
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(st, resume=True)
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert r.capsule_host(1).tobytes() == s.capsule_host(1).tobytes()


def test_capsules_every_n_steps_persist_deltas_of_n_entries_across_page_boundaries(tmp_path):
    c = cfg(capsule_every_n_steps=7)  # 7 entries per DELTA; 128 is no multiple of 7, so some span two pages
    s = Session(c)
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:400]:
        s.step(o)
    s.disable_persistence()
    r = Session(c)
    report = r.enable_persistence(settings(tmp_path), resume=True)
    assert report.step == 399 // 7 * 7 and r.state_host().tobytes() == s.capsule_host(s.live_capsule_id).tobytes()
    for o in OBS[report.step:report.step + 50]:
        r.step(o)
    s.rollback(steps_back=400 - report.step)
    for o in OBS[report.step:report.step + 50]:
        s.step(o)
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_a_runtime_that_holds_its_lock_all_the_time_never_starves_the_writer(tmp_path):
    import time
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, queue_mb=0.25))  # ~70 small records may wait
    with s.lock:  # as a runtime stepping back to back, or a long replan: the writer never sees it idle
        for o in OBS[:300]:
            s.step(o)
            time.sleep(0.0005)  # the GIL is free now and then, the runtime lock never
    assert s.persistence.flush()
    st = s.persistence.stats()
    assert (st.records_written, st.records_dropped) == (300, 0)
