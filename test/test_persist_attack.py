"""Adversarial review of the capsule log (issue 11): crafted, damaged or racing inputs to persist/resume.

Each test states a defect that was found and fixed: a damaged or crafted log either resumes at the last
good record of a torn tail, or is refused with LogCorrupt naming the file; never another exception,
never a silently older or wrong state, never a deleted file.
"""
from __future__ import annotations

import struct
import threading
import time
import zlib
from pathlib import Path

import pytest
from persist_fixtures import cfg, settings

from conftest import WatchedLock, assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import layout_of
from flashrt_ros.runtime.persist.format import (
    INFO,
    RECORD_HEAD,
    RECORD_MAGIC,
    RESYNC,
    LogCorrupt,
    iter_segment_paths,
    scan,
)
from flashrt_ros.runtime.persist.resume import meta_reader
from flashrt_ros.runtime.persist.writer import PersistSettings

OBS = observation_trace(200)



def persisting(tmp_path, n=40, **kw) -> Session:
    """A session that persists into tmp_path/log and has stepped OBS[:n]; its log still open."""
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, **kw))
    for o in OBS[:n]:
        s.step(o)
    return s


def stepped(tmp_path, n=40, **kw) -> Session:
    """persisting(), its log closed (written and fsynced)."""
    s = persisting(tmp_path, n, **kw)
    s.disable_persistence()
    return s


def records_of(s, seg: Path):
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert err is None
    return recs


def newest_segment(tmp_path) -> Path:
    return list(iter_segment_paths(tmp_path / "log"))[-1]


def raw_record(kind: int, payload: bytes) -> bytes:
    """A record with a valid checksum over whatever payload: what a hostile file can hold."""
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<BI", kind, len(payload))))
    return RECORD_HEAD.pack(RECORD_MAGIC, kind, len(payload), crc) + payload


def assert_enable_refused(settings_, exc, match, resume=True) -> Session:
    """A session with something to lose refuses enable_persistence(settings_) with ``exc`` matching
    ``match``, its state, capsules and step as before, and no persistence attached. Returns it."""
    s = Session(cfg())
    s.step(OBS[0])
    assert_refused_unchanged(s, lambda: s.enable_persistence(settings_, resume=resume), exc, match)
    assert s.persistence is None
    return s


# ---- records whose checksum is valid but whose payload is too short --------------------------
@pytest.mark.parametrize("label_len, extra", [(10, b""), (0, b"\0" * 7)])
def test_a_checksummed_record_too_short_for_its_fields_is_log_corrupt_not_a_numpy_error(tmp_path, label_len, extra):
    s = stepped(tmp_path, 5)
    seg = newest_segment(tmp_path)
    payload = INFO.pack(99, 5, 6, 0, 0, 1, label_len) + extra  # no label bytes / no small state
    seg.write_bytes(seg.read_bytes() + raw_record(RESYNC, payload))
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert len(recs) == 5 and isinstance(err, LogCorrupt) and "holds" in err.why
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)  # the tail: cut, as a torn record
    r.disable_persistence()
    assert (report.step, report.records_cut) == (5, 1)
    assert r.state_host().tobytes() == s.state_host().tobytes()


# ---- the newest segment's header -------------------------------------------------------------
def test_a_flipped_byte_in_the_newest_segments_header_refuses_and_keeps_the_file(tmp_path):
    stepped(tmp_path, 30)  # one segment, 30 records
    seg = newest_segment(tmp_path)
    blob = bytearray(seg.read_bytes())
    assert len(records_of(Session(cfg()), seg)) > 1
    blob[20] ^= 0x01  # inside the JSON: its checksum fails, the records after it are intact
    seg.write_bytes(bytes(blob))
    assert_enable_refused(settings(tmp_path), LogCorrupt, f"{seg.name}: offset 0")
    assert seg.read_bytes() == bytes(blob), "a segment full of records was deleted as a 'torn header'"


def test_a_torn_header_of_the_newest_segment_is_still_cut(tmp_path):
    s = stepped(tmp_path, 30, segment_mb=0.05)
    segs = list(iter_segment_paths(tmp_path / "log"))
    head_len = records_of(s, segs[-1])[0].offset
    torn = segs[-1].with_name("seg-99999999.frl")
    torn.write_bytes(segs[-1].read_bytes()[:head_len - 3])  # a kill while rotating: part of a header
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert not torn.exists() and report.step == 30 and "never got a record" in report.cut


# ---- damage in the middle of the newest segment ------------------------------------------------
def test_a_flipped_byte_in_a_middle_record_of_the_newest_segment_refuses_instead_of_cutting_good_records(tmp_path):
    s = stepped(tmp_path, 40)
    seg = newest_segment(tmp_path)
    offs = [r.offset for r in records_of(s, seg)]
    blob = bytearray(seg.read_bytes())
    blob[offs[10] + 60] ^= 0x10  # record 11 of 40: 29 good records follow it
    seg.write_bytes(bytes(blob))
    assert_enable_refused(settings(tmp_path), LogCorrupt, f"{seg.name}: offset {offs[10]}: .*valid records follow")
    assert seg.read_bytes() == bytes(blob), "good records after the damage were truncated away"


# ---- the timeline's order --------------------------------------------------------------------
def _rewrite(seg: Path, recs, keep) -> None:
    blob = seg.read_bytes()
    parts = [blob[:recs[0].offset]] + [blob[recs[i].offset:recs[i].offset + recs[i].nbytes] for i in keep]
    seg.write_bytes(b"".join(parts))


@pytest.mark.parametrize("case", ["hole", "duplicate", "swapped"])
def test_a_timeline_with_a_hole_a_duplicate_or_swapped_records_is_refused_not_loaded(tmp_path, case):
    s = stepped(tmp_path, 20)
    seg = newest_segment(tmp_path)
    recs = records_of(s, seg)
    keep = list(range(len(recs)))
    if case == "hole":
        keep.remove(7)  # every record checksums, but the DELTA after it appends onto the wrong window
    elif case == "duplicate":
        keep.insert(8, 7)
    else:
        keep[7], keep[8] = 8, 7
    _rewrite(seg, recs, keep)
    assert_enable_refused(settings(tmp_path), LogCorrupt, seg.name)


# ---- pin files -------------------------------------------------------------------------------
def test_a_pin_file_whose_name_does_not_match_its_capsule_is_refused_cleanly(tmp_path):
    s = persisting(tmp_path, 10)
    s.pin(3)
    s.disable_persistence()
    pin = tmp_path / "log" / f"pin-{3:016d}.frl"
    (tmp_path / "log" / f"pin-{4:016d}.frl").write_bytes(pin.read_bytes())  # two files, one capsule id
    assert_enable_refused(settings(tmp_path), LogCorrupt, f"pin-{4:016d}.frl")


def test_a_pin_file_that_cannot_be_written_counts_an_error_and_the_pin_still_holds(tmp_path):
    s = persisting(tmp_path, 10)
    (tmp_path / "log" / f"pin-{5:016d}.frl" / "x").mkdir(parents=True)  # the file cannot take its name
    info = s.pin(5)  # the pin took effect in memory: the call must not fail after that
    assert info.pinned and s.capsule_info(5).pinned
    st = s.persistence.stats()
    assert st.write_errors == 1 and "pin" in st.last_error
    assert not list((tmp_path / "log").glob(".pin-*.tmp"))  # no temporary file left behind
    snap = s.snapshot(label="kept", pin=True)  # the same for a pinned snapshot (the live id moved already)
    assert s.live_capsule_id == snap.id
    s.disable_persistence()


# ---- persist_dir -----------------------------------------------------------------------------
def test_a_persist_dir_that_is_a_file_fails_before_touching_the_live_state(tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_bytes(b"x")
    assert_enable_refused(PersistSettings(target, fsync_every_ms=0.0), OSError, "not-a-dir")


# ---- disable_persistence against a running replan -----------------------------------------------
def test_disable_persistence_waits_for_a_running_replan_whose_commit_is_then_persisted(tmp_path):
    s = persisting(tmp_path, 20)
    s.branch_lock = WatchedLock(s.branch_lock)  # a replan holds it throughout; its session lock only at times
    disabler = threading.Thread(target=s.disable_persistence)
    seen = []

    def on_step(done):
        if done == 1:
            disabler.start()
            # the disabler has reached the branch lock and waits there: it ran up to its critical section
            seen.append(s.branch_lock.contended.wait(30))
            seen.append(disabler.is_alive())

    res = s.replan(None, OBS[None, 20:24], commit_branch=0, on_step=on_step)
    disabler.join(10)
    assert seen == [True, True], "disable_persistence ran in the middle of a replan, without the session lock"
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert report.capsule_id == res.live_capsule_id
    assert r.state_host().tobytes() == s.state_host().tobytes()


# ---- a pin file racing an unpin or a drop -----------------------------------------------------
@pytest.mark.parametrize("undo", ["unpin", "drop"])
def test_an_unpin_or_drop_while_the_pin_file_is_written_leaves_no_pin_file(tmp_path, monkeypatch, undo):
    from flashrt_ros.runtime.persist.writer import CapsuleLog

    s = persisting(tmp_path, 10)
    encoding, undone = threading.Event(), threading.Event()
    real = CapsuleLog.write_pin

    def slow_write_pin(self, *a, **kw):  # only the scheduling changes: the pin's file is written after the undo
        encoding.set()
        undone.wait(5)
        return real(self, *a, **kw)

    monkeypatch.setattr(CapsuleLog, "write_pin", slow_write_pin)
    pinner = threading.Thread(target=s.pin, args=(4,))
    pinner.start()
    encoding.wait(5)
    s.unpin(4) if undo == "unpin" else s.drop(4)
    undone.set()
    pinner.join(5)
    assert not (tmp_path / "log" / f"pin-{4:016d}.frl").exists(), f"a pin file outlived the {undo}"
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert not r.list_capsules(pinned_only=True)


def test_a_pin_unpin_pin_sequence_keeps_the_pin_file(tmp_path):
    s = persisting(tmp_path, 10)
    s.pin(4)
    s.unpin(4)
    s.pin(4)
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert [i.id for i in r.list_capsules(pinned_only=True)] == [4]
    assert r.capsule_host(4).tobytes() == s.capsule_host(4).tobytes()


# ---- pins that share their window's pages -------------------------------------------------------
def test_pins_of_neighbouring_capsules_that_fit_the_running_store_fit_the_resumed_one(tmp_path):
    c = cfg(capsule_budget_mb=2.0)  # 28 KV log pages, 20 reserved: the pins' windows must share pages
    s = Session(c)
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:200]:
        s.step(o)
    for cid in range(150, 201):  # 51 pins over 2 shared pages: allowed while they share them
        s.pin(cid)
    s.disable_persistence()
    r = Session(c)
    report = r.enable_persistence(settings(tmp_path), resume=True)  # was: StoreFullOfPins, pin files one window each
    r.disable_persistence()
    assert report.pinned == 51 and r.state_host().tobytes() == s.state_host().tobytes()
    for cid in (150, 175, 200):
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes()


def test_a_resume_into_a_session_that_stepped_on_its_own_holds_only_the_logs_capsules(tmp_path):
    s = stepped(tmp_path, 40)
    r = Session(cfg())
    for o in OBS[100:140]:  # 40 capsules of its own, under the ids the log uses too
        r.step(o)
    r.pin(20)
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert report.capsule_id == 40 and r.state_host().tobytes() == s.state_host().tobytes()
    assert not r.list_capsules(pinned_only=True)
    for cid in (1, 20, 40):
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid


def test_a_log_whose_pins_do_not_fit_a_smaller_store_is_refused_with_a_clear_error(tmp_path):
    from flashrt_ros.runtime.persist.resume import ResumeDoesNotFit

    s = persisting(tmp_path, 60)
    for cid in range(10, 61):
        s.pin(cid)
    s.disable_persistence()
    small = cfg(capsule_capacity=40)  # not in the fingerprint: the same log, a smaller store
    r = Session(small)
    with pytest.raises(ResumeDoesNotFit, match="do not fit this capsule store .*capsule_capacity"):
        r.enable_persistence(settings(tmp_path), resume=True)
    assert r.persistence is None and len(r.list_capsules()) == 0
    assert r.state_host().tobytes() == Session(small).state_host().tobytes()  # reset, not half rebuilt


# ---- two writers on one persist_dir -------------------------------------------------------------
def test_a_second_session_on_a_persist_dir_in_use_is_refused_and_touches_nothing(tmp_path):
    a = persisting(tmp_path, 30)
    a.persistence.flush()
    seg = newest_segment(tmp_path)
    torn = seg.read_bytes() + b"FRR1\x01"  # the writer is mid-record: a resume would cut it as torn
    seg.write_bytes(torn)
    b = assert_enable_refused(settings(tmp_path), OSError, "in use")
    assert seg.read_bytes() == torn, "a second session truncated the segment the first one is writing"
    seg.write_bytes(torn[:-5])
    a.disable_persistence()  # the directory is free again
    report = b.enable_persistence(settings(tmp_path), resume=True)
    b.disable_persistence()
    assert report.capsule_id == 30


def test_enable_disable_cycles_and_refused_enables_leak_no_file_descriptor(tmp_path):
    import os

    def fds():
        return len(os.listdir("/proc/self/fd"))

    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))  # warm-up: imports, the first writer thread
    s.disable_persistence()
    before = fds()
    other = Session(cfg())
    for k in range(5):
        s.enable_persistence(settings(tmp_path), resume=bool(k))
        for o in OBS[k * 5:k * 5 + 5]:
            s.step(o)
        s.pin(s.live_capsule_id)
        with pytest.raises(OSError, match="in use"):
            other.enable_persistence(settings(tmp_path), resume=True)
        s.disable_persistence()
    assert fds() == before


# ---- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("field, param", [("fsync_every_ms", "persist_fsync_ms"), ("queue_mb", "persist_queue_mb"),
                                          ("fsync_every_records", "persist_fsync_records")])
def test_an_infinite_persist_setting_is_refused_naming_its_parameter(tmp_path, field, param):
    # fsync_every_ms=inf used to kill the writer thread (a Queue.get timeout too large), so nothing was ever
    # written while the node went on as if persisting; queue_mb=inf failed with an OverflowError
    with pytest.raises(ValueError, match=param):
        PersistSettings(tmp_path / "log", **{field: float("inf")})


def test_a_huge_but_finite_fsync_period_keeps_the_writer_alive(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, fsync_every_ms=1e16))  # past threading.TIMEOUT_MAX in seconds
    writer, waiting = s.persistence.log._thread, s.persistence.log._queue.not_empty._waiters
    while writer.is_alive() and not waiting:  # until the writer is in its idle wait (or died entering it)
        time.sleep(0.001)
    assert writer.is_alive()
    s.step(OBS[0])
    assert s.persistence.flush(5) and s.persistence.stats().records_written == 1
    s.disable_persistence()


def test_a_record_whose_id_leaves_no_room_for_new_ids_is_not_loaded(tmp_path):
    # resumed, it made every later id 2**64: each new record failed to encode and the log stopped for good
    from dataclasses import replace as dc_replace

    from flashrt_ros.runtime.persist.format import encode_record

    s = stepped(tmp_path, 5)
    seg = newest_segment(tmp_path)
    last = records_of(s, seg)[-1]
    info = dc_replace(s.capsule_info(5), id=2**64 - 1)
    blob = seg.read_bytes()
    forged = encode_record(last.kind, info, last.small, last.kv, len(last.kv))
    seg.write_bytes(blob[:last.offset] + forged)
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert len(recs) == 4 and "out of range" in err.why
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)  # the tail: cut like a torn record
    assert (report.capsule_id, report.records_cut) == (4, 1)
    r.step(OBS[4])
    assert r.persistence.flush(5)
    assert r.persistence.stats().write_errors == 0
    r.disable_persistence()


# ---- a rollback is recorded (a LIVE marker) -------------------------------------------------------
def test_a_rollback_followed_by_a_crash_resumes_the_rolled_back_state(tmp_path):
    s = persisting(tmp_path, 40)
    s.rollback(steps_back=10)  # the planner undid ten steps; the node dies before the next observation
    s.disable_persistence()
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert report.capsule_id == s.live_capsule_id == 30
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_steps_after_a_recorded_rollback_resume_at_the_newest_capsule_and_continue_identically(tmp_path):
    s = persisting(tmp_path, 40)
    s.rollback(steps_back=10)
    s.rollback(steps_back=5)  # two markers in a row: the last one is the word
    for o in OBS[25:45]:
        s.step(o)
    s.disable_persistence()
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert (report.capsule_id, report.step) == (s.live_capsule_id, 45)
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert r.step(OBS[45]).action.tobytes() == s.step(OBS[45]).action.tobytes()


def test_a_live_marker_with_state_bytes_is_refused(tmp_path):
    import struct
    import zlib

    from flashrt_ros.runtime.persist.attach import layout_of
    from flashrt_ros.runtime.persist.format import INFO, LIVE, RECORD_HEAD, RECORD_MAGIC, scan
    from flashrt_ros.runtime.persist.resume import meta_reader

    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    s.step(OBS[0])
    s.disable_persistence()
    seg = next(iter_segment_paths(tmp_path / "log"))
    payload = INFO.pack(1, 0, 1, 0, 0, 0, 0) + b"extra"
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<BI", LIVE, len(payload))))
    seg.write_bytes(seg.read_bytes() + RECORD_HEAD.pack(RECORD_MAGIC, LIVE, len(payload), crc) + payload)
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert len(recs) == 1 and err is not None and "live marker" in err.why
