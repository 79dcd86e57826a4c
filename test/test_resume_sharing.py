"""A resume rebuilds the page sharing the crashed store had (issue 15, items 2.6 and 7.1): whole-window
records (after a rollback, a commit, at a segment's start) and pin files share the pages of what was
rebuilt before them wherever they hold the same entries, so the resumed store holds the same rollback
history, and a store that ran with pins always resumes."""
from __future__ import annotations

import numpy as np
from persist_fixtures import crash_copy, settings

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session

OBS = observation_trace(1200)


def resume_copy(c, st) -> tuple[Session, object]:
    r = Session(c)
    report = r.enable_persistence(st, resume=True)
    r.disable_persistence()
    return r, report


def test_rollbacks_and_commits_resume_with_the_same_capsules_lineage_and_rollback_depth(tmp_path):
    # a small budget: whole-window records loaded into fresh pages evicted 158 of 400 capsules
    c = small_config(kv_window=256, capsule_capacity=400, capsule_budget_mb=2.5)
    s = Session(c)
    s.enable_persistence(settings(tmp_path))
    k, what_ifs = 40, set()
    for o in OBS[:k]:
        s.step(o)
    for i in range(12):
        s.rollback(steps_back=10)
        if i % 4 == 1:  # a commit from the live state (its sibling is a what-if, never persisted)
            res = s.replan(None, np.stack([OBS[k:k + 5], OBS[k:k + 5] * 0.5]), commit_branch=1)
            what_ifs |= {res.branch_capsule_ids[0]}
        elif i % 4 == 3:  # a commit from an older capsule: the timeline jumps
            older = s.store.ancestor(s.live_capsule_id, s.step_count - 3)
            res = s.replan(older.id, OBS[None, k:k + 4] * 0.9, commit_branch=0)
        for o in OBS[k:k + 40]:
            s.step(o)
        k += 40
    crashed = crash_copy(s, tmp_path, "crash")
    before = s.store_usage()
    r, report = resume_copy(c, crashed)
    after = r.store_usage()

    lineage = {i.id: (i.parent_id, i.step, i.label) for i in s.list_capsules() if i.id not in what_ifs}
    assert len(lineage) > 300
    assert {i.id: (i.parent_id, i.step, i.label) for i in r.list_capsules()} == lineage
    assert (after.capsules, after.rollback_depth_steps) == (len(lineage), before.rollback_depth_steps)
    assert r.kv.pages_used <= s.kv.pages_used  # the sharing came back (what-ifs hold private pages)
    depth = before.rollback_depth_steps
    assert depth > 200
    assert r.rollback(steps_back=depth).id == s.rollback(steps_back=depth).id
    assert r.state_host().tobytes() == s.state_host().tobytes()
    for o in OBS[k:k + 5]:
        assert r.step(o).action.tobytes() == s.step(o).action.tobytes()


def test_a_segment_start_shares_the_pages_of_the_record_before_it(tmp_path):
    c = small_config(kv_window=256, capsule_capacity=400, capsule_budget_mb=2.5)
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.6))  # a whole-window record every ~150 steps
    for o in OBS[:450]:
        s.step(o)
    crashed = crash_copy(s, tmp_path, "crash", segment_mb=0.6)
    assert s.persistence.stats().resyncs_written >= 3
    r, _ = resume_copy(c, crashed)
    assert [i.id for i in r.list_capsules()] == [i.id for i in s.list_capsules()]
    assert r.kv.pages_used == s.kv.pages_used
    for cid in (s.list_capsules()[0].id, s.live_capsule_id):
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes()


def test_a_store_that_ran_with_30_pins_resumes_after_their_records_left_the_log(tmp_path):
    c = small_config(kv_window=150, capsule_budget_mb=2.0)  # 28 KV log pages, 20 reserved
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.2))
    for o in OBS[:200]:
        s.step(o)
    pins = list(range(171, 201))
    for cid in pins:  # allowed: the pins share their windows' pages
        s.pin(cid)
    for o in OBS[200:700]:  # the pinned capsules' records are far behind what resume reads: pin files only
        s.step(o)
    crashed = crash_copy(s, tmp_path, "crash", segment_mb=0.2)
    r, report = resume_copy(c, crashed)  # was: ResumeDoesNotFit, each pin file a window of its own
    assert report.pinned == 30 and report.step == 700
    assert [i.id for i in r.list_capsules(pinned_only=True)] == pins
    assert r.state_host().tobytes() == s.state_host().tobytes()
    for cid in pins:
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid
    assert r.kv.pages_used <= s.kv.pages_used
    # and the resumed store runs on as the crashed one would: pins hold, steps continue identically
    for o in OBS[700:720]:
        assert r.step(o).action.tobytes() == s.step(o).action.tobytes()
    r.rollback(pins[0])
    s.rollback(pins[0])
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_pins_on_branches_and_far_apart_resume_byte_exactly(tmp_path):
    c = small_config(kv_window=150, capsule_budget_mb=4.0)
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.2))
    for o in OBS[:100]:
        s.step(o)
    s.pin(60)
    s.pin(100)
    s.rollback(steps_back=20)  # a pin on another branch, past the pin before it: they share steps 0-80 only
    for o in OBS[300:330]:
        s.step(o)
    s.pin(s.live_capsule_id)
    for o in OBS[310:800]:
        s.step(o)
    crashed = crash_copy(s, tmp_path, "crash", segment_mb=0.2)
    r, report = resume_copy(c, crashed)
    pinned = [i.id for i in s.list_capsules(pinned_only=True)]
    assert report.pinned == 3 and [i.id for i in r.list_capsules(pinned_only=True)] == pinned
    for cid in pinned:
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid


def test_pins_on_five_branches_that_fit_the_running_store_fit_the_resumed_one(tmp_path):
    c = small_config(kv_window=150, capsule_budget_mb=2.0)  # 28 KV log pages, 20 reserved: pins may hold 8
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.4))
    for o in OBS[:180]:
        s.step(o)
    base = s.live_capsule_id
    for branch in range(5):  # each branch shares the first page and copies the second (copy-on-write)
        s.rollback(base)
        for o in OBS[300 + 10 * branch:305 + 10 * branch]:
            s.step(o)
            s.pin(s.live_capsule_id)
    assert s.kv.pages_used < 8
    for o in OBS[400:900]:  # the pins' records fall behind what resume reads: pin files only
        s.step(o)
    crashed = crash_copy(s, tmp_path, "crash", segment_mb=0.4)
    r, report = resume_copy(c, crashed)  # whole-prefix sharing only: 2 pages per branch, did not fit
    pinned = [i.id for i in s.list_capsules(pinned_only=True)]
    assert report.pinned == 25 and [i.id for i in r.list_capsules(pinned_only=True)] == pinned
    for cid in pinned:
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid
    assert r.state_host().tobytes() == s.state_host().tobytes()
