"""Pins spaced more than kv_window apart resume (issue 15, item 7.1: a store that ran must always resume).

In the running store the live row appends the steps between two such pins into the page the older pin's
window ends in, so the newer pin's window starts in that same page. A resume that loaded each pin file's
window into fresh pages needed one page more per pin than the store that accepted them, and refused
(ResumeDoesNotFit). The rebuilt windows continue that page instead."""
from __future__ import annotations

import pytest
from persist_fixtures import crash_copy, settings

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.errors import StoreFullOfPins

OBS = observation_trace(3400)
TAIL = slice(3000, 3400)  # steps after the pins: their records leave what resume reads, pin files only


def run_with_pins(c, tmp_path, gap: int, rollback: bool) -> tuple[Session, list[int]]:
    """Step ``gap`` at a time and pin each live capsule until the store refuses a pin."""
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.31))
    k, pins = 0, []
    while True:
        for o in OBS[k:k + gap]:
            s.step(o)
        k += gap
        try:
            s.pin(s.live_capsule_id)
        except StoreFullOfPins:
            break
        pins.append(s.live_capsule_id)
    if rollback:  # the newest steps then branch off a pin in the middle
        s.rollback(pins[len(pins) // 2])
    for o in OBS[TAIL]:
        s.step(o)
    return s, pins


def run_with_pins_on_two_branches(c, tmp_path, gaps: tuple[int, int]) -> tuple[Session, list[int]]:
    """Two branches from step 10, taking turns: roll back to the branch's newest pin, step its gap, pin.
    By id, each pin follows the other branch's, not the one its window continues."""
    s = Session(c)
    s.enable_persistence(settings(tmp_path, segment_mb=0.31))
    for o in OBS[:10]:
        s.step(o)
    tips, k, pins = [s.live_capsule_id] * 2, [10, 1500], []
    while True:
        for b in (0, 1):
            s.rollback(tips[b])
            for o in OBS[k[b]:k[b] + gaps[b]]:
                s.step(o)
            k[b] += gaps[b]
            try:
                s.pin(s.live_capsule_id)
            except StoreFullOfPins:
                for o in OBS[TAIL]:
                    s.step(o)
                return s, pins
            tips[b] = s.live_capsule_id
            pins.append(tips[b])


@pytest.mark.parametrize("kv_window, gap, rollback", [
    (150, 170, False), (150, 200, False), (150, 230, False), (150, 170, True),
    (48, 60, False), (48, 100, True),
])
def test_pins_further_apart_than_the_window_resume_byte_exactly(tmp_path, kv_window, gap, rollback):
    c = small_config(kv_window=kv_window, capsule_budget_mb=3.0, capsule_capacity=200)
    s, pins = run_with_pins(c, tmp_path, gap, rollback)
    assert_resumes_byte_exactly(c, tmp_path, s, pins)


@pytest.mark.parametrize("kv_window, gaps", [(48, (60, 100)), (150, (170, 230))])
def test_far_apart_pins_taken_on_two_branches_in_turn_resume_byte_exactly(tmp_path, kv_window, gaps):
    c = small_config(kv_window=kv_window, capsule_budget_mb=3.0, capsule_capacity=200)
    s, pins = run_with_pins_on_two_branches(c, tmp_path, gaps)
    assert_resumes_byte_exactly(c, tmp_path, s, pins)


def assert_resumes_byte_exactly(c, tmp_path, s: Session, pins: list[int]) -> None:
    assert len(pins) >= 10  # as many as the running store accepted, up to its page limit for pins
    crashed = crash_copy(s, tmp_path, "crash", segment_mb=0.31)
    r = Session(c)
    with r.backend.activate():  # what no window holds must never count: every page starts as junk
        for log in r.kv.k + r.kv.v:
            log.fill(7.0)
    report = r.enable_persistence(crashed, resume=True)  # was: ResumeDoesNotFit
    r.disable_persistence()
    assert report.pinned == len(pins)
    assert [i.id for i in r.list_capsules(pinned_only=True)] == pins
    assert r.kv.pages_used <= s.kv.pages_used
    assert r.state_host().tobytes() == s.state_host().tobytes()
    for cid in pins:
        assert r.capsule_host(cid).tobytes() == s.capsule_host(cid).tobytes(), cid
    # every pin runs on as the crashed store's would: the slots between windows are never read
    for cid in pins[::3] + pins[-1:]:
        r.rollback(cid)
        s.rollback(cid)
        for o in OBS[TAIL][:3]:
            assert r.step(o).action.tobytes() == s.step(o).action.tobytes(), cid
    s.disable_persistence()
