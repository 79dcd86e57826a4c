"""Issue 15, 7.7 / 7.8: pin files count in persist_budget_mb, a pin that cannot be kept on disk is refused
before anything changes, retention never removes a pinned capsule's file, an unchanged pin file is not
rewritten, and a pin's or an export's window is gathered while steps go on."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from persist_fixtures import cfg, settings

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import layout_of
from flashrt_ros.runtime.persist.format import pin_name, segment_header_bytes
from flashrt_ros.runtime.persist.writer import MB, PinNotPersistable, whole_window_bytes

OBS = observation_trace(1500)
WAIT_S = 60.0  # only bounds a deadlock: every wait below is on an event


def pin_mb(s: Session) -> float:
    layout = layout_of(s)
    return (len(segment_header_bytes(layout)) + whole_window_bytes(layout)) / MB


def budget_for_pins(s: Session, pins: float) -> dict:
    """Log settings whose budget holds two segments and ``pins`` pin files."""
    segment_mb = 4 * whole_window_bytes(layout_of(s)) / MB * 1.01
    return dict(segment_mb=segment_mb, budget_mb=2 * segment_mb + pins * pin_mb(s))


def pin_files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "log").glob("pin-*.frl"))


def pinned(s: Session) -> list[int]:
    return [c.id for c in s.list_capsules(pinned_only=True)]


def test_a_pin_whose_file_would_not_fit_the_budget_is_refused_and_changes_nothing(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, **budget_for_pins(s, 3.5)))
    for o in OBS[:20]:
        s.step(o)
    for cid in (3, 6, 9):
        s.pin(cid)
    s.pin(6)  # pinned already: nothing new on disk, accepted
    assert_refused_unchanged(s, lambda: s.pin(12), PinNotPersistable, "persist_budget_mb.*unpin")
    assert_refused_unchanged(s, lambda: s.snapshot(label="x", pin=True), PinNotPersistable, "persist_budget_mb")
    assert pinned(s) == [3, 6, 9] and pin_files(tmp_path) == [pin_name(c) for c in (3, 6, 9)]
    s.unpin(3)
    s.pin(12)  # room again
    s.disable_persistence()
    assert pin_files(tmp_path) == [pin_name(c) for c in (6, 9, 12)]


PINS = list(range(2, 22, 2))


def test_retention_keeps_every_pinned_capsules_file_even_past_a_smaller_budget(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path, **budget_for_pins(s, 10.5)))
    for o in OBS[:30]:
        s.step(o)
    for cid in PINS:
        s.pin(cid)
    s.disable_persistence()
    # a restart with a budget that holds none of those ten pins: resumed pins are pinned capsules, and
    # retention, now short of room, removes every old segment but never a pinned capsule's file
    r = Session(cfg())
    small = budget_for_pins(r, 0.5)
    r.enable_persistence(settings(tmp_path, **small), resume=True)
    for o in OBS[30:1200]:
        r.step(o)
    assert r.persistence.flush()
    st = r.persistence.stats()
    r.disable_persistence()
    assert st.segments <= 2 and st.pins == len(PINS), st
    assert pin_files(tmp_path) == [pin_name(c) for c in PINS]
    assert pinned(r) == PINS


def test_pinning_a_pinned_capsule_again_leaves_its_file_untouched(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:10]:
        s.step(o)
    s.pin(4)
    path = tmp_path / "log" / pin_name(4)
    before = path.stat()
    for _ in range(3):
        s.pin(4)
    after = path.stat()
    s.disable_persistence()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def refs_consistent(s: Session) -> bool:
    """Every page reference is held by a row or a capsule: nothing a file writer held is left over."""
    tables = [s.kv.tables.ravel()] + [c.pages for c in s.store._caps.values()]
    held = np.concatenate(tables)
    return np.array_equal(np.bincount(held[held >= 0], minlength=s.kv.n_pages), s.kv.refs)


class BlockedGather:
    """Wraps the session's KV window copies (gather: an export; window: a pin file): a call from ``thread_name``
    waits until released. Only the scheduling changes: the copy is the real one."""

    def __init__(self, s: Session, thread_name: str):
        self.entered, self.release = threading.Event(), threading.Event()
        for name in ("gather", "window"):
            setattr(s.kv, name, self._blocking(getattr(s.kv, name), thread_name))

    def _blocking(self, real, thread_name: str):
        def copy(*a, **kw):
            if threading.current_thread().name == thread_name:
                self.entered.set()
                assert self.release.wait(WAIT_S)
            return real(*a, **kw)
        return copy


@pytest.mark.parametrize("what", ["pin", "export"])
def test_a_step_goes_on_while_a_pin_or_export_gathers_its_window(tmp_path, what):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    ref = Session(cfg())
    for o in OBS[:30]:
        s.step(o)
        ref.step(o)
    blocked = BlockedGather(s, "writer")
    target = (lambda: s.pin(7)) if what == "pin" else (lambda: s.export_capsule(7, tmp_path / "c7.safetensors"))
    writer = threading.Thread(target=target, name="writer")
    writer.start()
    assert blocked.entered.wait(WAIT_S)
    stepped = threading.Event()
    stepper = threading.Thread(target=lambda: (s.step(OBS[30]), stepped.set()))
    stepper.start()
    try:
        assert stepped.wait(WAIT_S), f"the step waited for the {what}'s window copy"
    finally:
        blocked.release.set()
        writer.join(WAIT_S)
        stepper.join(WAIT_S)
    assert s.state_host().tobytes() == (ref.step(OBS[30]), ref.state_host().tobytes())[1]
    assert refs_consistent(s)
    s.disable_persistence()
    if what == "export":
        imported = Session(cfg())
        info = imported.import_capsule(tmp_path / "c7.safetensors", restore=True)
        assert imported.state_host().tobytes() == (ref.rollback(7), ref.state_host().tobytes())[1], info
    else:
        r = Session(cfg())
        r.enable_persistence(settings(tmp_path), resume=True)
        r.disable_persistence()
        assert pinned(r) == [7]
        assert r.materialize(7).keys() == ref.materialize(7).keys()
        assert all(np.array_equal(r.materialize(7)[k], ref.materialize(7)[k]) for k in ref.materialize(7))


def test_an_unpin_and_drop_during_a_pin_files_gather_release_its_pages(tmp_path):
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:30]:
        s.step(o)
    blocked = BlockedGather(s, "writer")
    writer = threading.Thread(target=lambda: s.pin(7), name="writer")
    writer.start()
    assert blocked.entered.wait(WAIT_S)
    s.unpin(7)
    s.drop(7)  # its pages stay referenced by the writer until it is done
    blocked.release.set()
    writer.join(WAIT_S)
    assert not writer.is_alive() and refs_consistent(s)
    for o in OBS[30:400]:  # the window wraps: every page the writer held has been reused safely
        s.step(o)
    assert refs_consistent(s)
    s.disable_persistence()
    assert pin_files(tmp_path) == []
