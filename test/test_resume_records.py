"""Crash-resume keeps what the README promises: a labelled snapshot, a reset, a rollback right after a
resume, and `resume: false` as a fresh start (issue 15, section 2). A crash is the persist_dir copied
while the session runs (persist_fixtures.crash_copy)."""
from __future__ import annotations

import numpy as np
from persist_fixtures import cfg, crash_copy, settings

from conftest import observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.format import iter_segment_paths

OBS = observation_trace(200)


def persisting(tmp_path, n: int) -> Session:
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:n]:
        s.step(o)
    return s


def resumed(st) -> tuple[Session, object]:
    r = Session(cfg())
    report = r.enable_persistence(st, resume=True)
    r.disable_persistence()
    return r, report


def test_a_labelled_snapshot_right_after_a_step_survives_a_crash_with_its_label(tmp_path):
    s = persisting(tmp_path, 20)
    grasp = s.snapshot(label="before_grasp")  # the step's capsule is its parent, at the same step: 0 new entries
    crashed = crash_copy(s, tmp_path, "crash")
    st = s.persistence.stats()
    assert (st.records_written, st.records_dropped, st.write_errors) == (21, 0, 0), st.last_error
    r, report = resumed(crashed)
    assert (report.capsule_id, report.step) == (grasp.id, 20)
    assert r.capsule_info(grasp.id).label == "before_grasp"
    assert r.capsule_host(grasp.id).tobytes() == s.capsule_host(grasp.id).tobytes()
    assert r.state_host().tobytes() == s.state_host().tobytes()
    a, b = s.step(OBS[20]), r.step(OBS[20])
    assert a.action.tobytes() == b.action.tobytes()


def test_a_pinned_labelled_snapshot_after_a_step_is_one_record_and_its_pin_file(tmp_path):
    s = persisting(tmp_path, 10)
    grasp = s.snapshot(label="grasp", pin=True)
    for o in OBS[10:15]:
        s.step(o)
    r, _ = resumed(crash_copy(s, tmp_path, "crash"))
    info = r.capsule_info(grasp.id)
    assert (info.label, info.pinned, info.step) == ("grasp", True, 10)
    assert r.capsule_host(grasp.id).tobytes() == s.capsule_host(grasp.id).tobytes()


def test_a_reset_before_a_crash_resumes_to_the_reset_state_with_the_capsules_kept(tmp_path):
    s = persisting(tmp_path, 20)
    s.reset()
    fresh = Session(cfg())
    r, report = resumed(crash_copy(s, tmp_path, "crash"))
    assert (r.step_count, r.live_capsule_id, report.step) == (0, 0, 0)
    assert r.state_host().tobytes() == fresh.state_host().tobytes() == s.state_host().tobytes()
    assert [c.id for c in r.list_capsules()] == [c.id for c in s.list_capsules()]  # reset keeps capsules
    a, b = s.step(OBS[50]), r.step(OBS[50])
    assert a.action.tobytes() == b.action.tobytes()


def test_steps_after_a_reset_resume_at_the_newest_capsule_of_the_new_timeline(tmp_path):
    s = persisting(tmp_path, 20)
    s.reset()
    for o in OBS[50:55]:
        s.step(o)
    r, report = resumed(crash_copy(s, tmp_path, "crash"))
    assert (report.capsule_id, report.step) == (s.live_capsule_id, 5)
    assert r.state_host().tobytes() == s.state_host().tobytes()
    r.rollback(steps_back=2)  # the new timeline's lineage starts at the reset
    s.rollback(steps_back=2)
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_a_reset_right_after_a_resume_is_recorded(tmp_path):
    s = persisting(tmp_path, 20)
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(settings(tmp_path), resume=True)
    r.reset()  # nothing written by this run yet
    again, report = resumed(crash_copy(r, tmp_path, "crash"))
    assert (again.step_count, again.live_capsule_id, report.step) == (0, 0, 0)
    assert again.state_host().tobytes() == Session(cfg()).state_host().tobytes()


def test_a_rollback_right_after_a_resume_survives_the_next_crash(tmp_path):
    s = persisting(tmp_path, 40)
    s.disable_persistence()
    r = Session(cfg())
    r.enable_persistence(settings(tmp_path), resume=True)
    back = r.rollback(steps_back=5)  # before any observation: nothing written by this run yet
    again, report = resumed(crash_copy(r, tmp_path, "crash"))
    assert (report.capsule_id, report.step) == (back.id, 35)
    assert again.state_host().tobytes() == s.capsule_host(back.id).tobytes() == r.state_host().tobytes()


def test_resume_false_is_fresh_and_a_later_resume_sees_only_the_new_run(tmp_path):
    first = persisting(tmp_path, 30)
    first.disable_persistence()
    old_files = sorted(p.name for p in (tmp_path / "log").iterdir() if p.name.startswith(("seg-", "pin-")))
    second = Session(cfg())
    second.enable_persistence(settings(tmp_path))  # resume: false
    for o in OBS[100:105]:
        second.step(o)
    assert second.persistence.moved_aside is not None  # the discarded run is kept, out of resume's way
    assert sorted(p.name for p in second.persistence.moved_aside.iterdir()) == old_files
    third, report = resumed(crash_copy(second, tmp_path, "crash"))
    assert report.capsules == 5 and report.step == 5
    assert sorted(c.id for c in third.list_capsules()) == sorted(c.id for c in second.list_capsules())
    assert not set(c.id for c in third.list_capsules()) & set(c.id for c in first.list_capsules())
    assert third.state_host().tobytes() == second.state_host().tobytes()
    first_ids = {c.id for c in first.list_capsules()}
    assert min(c.id for c in second.list_capsules()) > max(first_ids)  # ids still never reused


def test_resume_false_on_an_empty_dir_moves_nothing(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    assert s.persistence.moved_aside is None
    s.step(OBS[0])
    s.disable_persistence()
    assert len(list(iter_segment_paths(tmp_path / "log"))) == 1
    assert not [p for p in (tmp_path / "log").iterdir() if p.name.startswith("stale-")]


def test_an_observation_history_is_not_needed_to_resume_after_a_reset(tmp_path):
    s = persisting(tmp_path, 10)
    s.reset()
    s.reset()  # two markers in a row
    r, report = resumed(crash_copy(s, tmp_path, "crash"))
    assert report.step == 0 and np.all(r.state_host() == 0)
