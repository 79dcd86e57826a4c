"""Capsule ids stay unique across crashes (issue 15, item 2.4): ids are reserved ahead of their use in
persist_dir/ids.frl, so a resume starts above every id a client could have seen (a what-if, a commit's
sibling, a record the kill lost), and such an old id is refused, never answered with another state."""
from __future__ import annotations

import numpy as np
import pytest
from persist_fixtures import cfg, crash_copy, settings

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.errors import UnknownCapsule
from flashrt_ros.runtime.persist import attach as persistence_mod
from flashrt_ros.runtime.persist.attach import layout_of
from flashrt_ros.runtime.persist.format import IDS_NAME, LogCorrupt, iter_segment_paths, read_id_limit, scan
from flashrt_ros.runtime.persist.resume import meta_reader

OBS = observation_trace(600)


def cut_last_records(s: Session, directory, n: int) -> list[int]:
    """What a kill leaves when the last ``n`` records were still queued: the newest segment cut before them.
    Returns the ids of the records cut."""
    seg = list(iter_segment_paths(directory))[-1]
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert err is None and len(recs) > n
    with open(seg, "r+b") as f:
        f.truncate(recs[-n].offset)
    return [r.id for r in recs[-n:]]


def test_no_id_a_client_saw_before_a_crash_is_handed_out_again_and_old_ones_are_refused(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:30]:
        s.step(o)
    what_if = s.replan(None, np.stack([OBS[30:34], OBS[30:34] * 0.5])).branch_capsule_ids  # never persisted
    sibling = s.replan(None, np.stack([OBS[30:33], OBS[30:33] * 0.7]), commit_branch=1).branch_capsule_ids[0]
    for o in OBS[33:40]:
        s.step(o)
    crashed = crash_copy(s, tmp_path, "crash")
    lost = cut_last_records(s, crashed.directory, 3)  # the kill lost what was still queued
    seen = {c.id for c in s.list_capsules()} | set(what_if) | {sibling} | set(lost)
    assert max(seen) == s.store.next_id - 1

    r = Session(cfg())
    report = r.enable_persistence(crashed, resume=True)
    assert report.capsule_id == lost[0] - 1
    for cid in [*what_if, sibling, *lost]:  # before: 2320 rolled back to another state, success
        assert_refused_unchanged(r, lambda cid=cid: r.rollback(cid), UnknownCapsule, "evicted or dropped")
    new = [r.step(o).capsule_id for o in OBS[40:45]]
    new += r.replan(None, np.stack([OBS[45:47]] * 3)).branch_capsule_ids
    assert not set(new) & seen and min(new) > max(seen)
    r.disable_persistence()


def test_the_reservation_is_on_disk_before_any_id_under_it_is_handed_out(tmp_path, monkeypatch):
    monkeypatch.setattr(persistence_mod, "ID_BLOCK", 8)  # a new block every few steps
    s = Session(cfg())
    st = settings(tmp_path)
    s.enable_persistence(st)
    rng = np.random.default_rng(3)
    for i, o in enumerate(OBS[:150]):
        s.step(o)
        if i % 17 == 5:  # ids in bursts: a replan of 6 branches takes 6 at once
            s.replan(None, np.stack([OBS[i:i + 2]] * 6))
        assert read_id_limit(st.directory) > s.store.next_id - 1, i
        if i % 51 == 5 or rng.random() < 0.03:  # a crash (right after a replan's what-ifs, or anywhere)
            crashed = crash_copy(s, tmp_path, f"crash{i}")
            r = Session(cfg())
            r.enable_persistence(crashed, resume=True)
            assert r.step(o).capsule_id >= s.store.next_id  # past every id handed out
            r.disable_persistence()
    assert s.persistence.stats().write_errors == 0
    s.disable_persistence()


def test_ids_continue_past_the_reservation_after_a_clean_stop_and_a_fresh_start(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:5]:
        s.step(o)
    s.disable_persistence()
    limit = read_id_limit(tmp_path / "log")
    assert limit > 5
    fresh = Session(cfg())
    fresh.enable_persistence(settings(tmp_path))  # resume: false: the old log goes aside, the ids stay
    assert fresh.step(OBS[0]).capsule_id == limit
    fresh.disable_persistence()
    assert read_id_limit(tmp_path / "log") > limit


@pytest.mark.parametrize("damage", ["flip", "short", "forged_huge"])
def test_a_damaged_id_reservation_refuses_the_resume_before_touching_anything(tmp_path, damage):
    from flashrt_ros.runtime.persist.format import MAX_ID, encode_id_limit

    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:5]:
        s.step(o)
    s.disable_persistence()
    path = tmp_path / "log" / IDS_NAME
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[9] ^= 1
    elif damage == "short":
        del blob[-1]
    else:  # a valid checksum over an id that leaves no room for new ones
        blob = bytearray(encode_id_limit(MAX_ID - 1))
    path.write_bytes(bytes(blob))
    r = Session(cfg())
    r.step(OBS[0])  # something to lose
    assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt, IDS_NAME)
    assert r.persistence is None


def test_a_disk_that_refuses_the_reservation_costs_an_error_never_a_step(tmp_path, monkeypatch):
    monkeypatch.setattr(persistence_mod, "ID_BLOCK", 8)
    s = Session(cfg())
    st = settings(tmp_path)
    s.enable_persistence(st)
    blocker = st.directory / f".{IDS_NAME}.tmp"  # where the reservation is written first: a directory now
    blocker.mkdir()
    steps = [s.step(o) for o in OBS[:30]]
    assert [r.step for r in steps] == list(range(1, 31)) and len({r.capsule_id for r in steps}) == 30
    st_now = s.persistence.stats()
    assert st_now.write_errors >= 1 and "reservation" in st_now.last_error
    blocker.rmdir()  # room again: the reservation catches up on the next ids
    for o in OBS[30:50]:
        s.step(o)
    assert read_id_limit(st.directory) > s.store.next_id - 1
    s.disable_persistence()
