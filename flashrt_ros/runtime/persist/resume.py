"""Reading a capsule log back (persist/format.py) and rebuilding a Session's store from it.

A torn tail of the newest segment (a kill mid-write) is cut at the last valid record, and the file is
truncated there. Anything wrong before that (an older segment, a pin file, another fingerprint) refuses
the resume with a message naming the file and the offset: a torn state is never loaded.

Rebuilding re-enacts the live row's history without running the model: a DELTA appends its entries the
way the step did (same copy-on-write); a RESYNC or a pin file shares the pages of its parent (or of the
record before it) as far as they hold its entries bit for bit and appends the rest, or appends its window
into the free tail of the page that one ends in (pins further apart than kv_window), else loads its window
into fresh pages; each record's small state becomes the row's, and the store snapshots it under the
record's own id. The page sharing, the ids and the lineage come out as the crashed node had them; only
capsules the store has no room for are left out, the oldest first. The last word may be a marker: a
rollback's capsule, or a reset.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CapsuleError
from ..model.kernels import KV_PAGE
from .format import (
    LIVE,
    MARKERS,
    RESET,
    RESYNC,
    LogCorrupt,
    LogLayout,
    Record,
    is_torn_header,
    iter_segment_paths,
    pin_name,
    scan,
    valid_record_after,
)


@dataclass(frozen=True)
class LogContents:
    records: list[Record]  # the timeline, oldest first, starting at a RESYNC
    pins: list[Record]
    records_cut: int  # torn records dropped at the tail (0 or 1: a kill tears at most the last one)
    cut: str  # what was cut and where ("" when nothing)
    newest_mtime: float  # wall time the newest segment was last written (the resumed state's age)
    max_id: int
    live_id: int = 0  # a LIVE marker after the last record: the capsule a rollback made live (0: the newest)
    reset: bool = False  # a RESET marker is the last word: the live row resumes reset (step 0, zeros)


@dataclass(frozen=True)
class ResumeReport:
    capsule_id: int
    step: int
    stamp_ns: int
    age_s: float
    records_read: int
    records_cut: int
    cut: str
    capsules: int  # restored into the store (the oldest may not fit)
    pinned: int
    elapsed_ms: float

    def summary(self) -> str:
        cut = f"; cut {self.cut}" if self.cut else ""
        live = (f"capsule {self.capsule_id} at step {self.step}" if self.capsule_id
                else "the reset state (a reset before the crash)")
        return (f"resumed {live} ({self.age_s:.1f} s old): "
                f"{self.records_read} records read, {self.capsules} capsules ({self.pinned} pinned) restored, "
                f"{self.records_cut} records cut{cut}, in {self.elapsed_ms:.0f} ms")


class ResumeDoesNotFit(CapsuleError):
    """A sound log whose pinned capsules (or the live window) need more than this store holds."""


def read_log(directory: Path, layout: LogLayout, meta_of, keep: int, truncate: bool) -> LogContents:
    """The newest ``keep`` records or more (whole segments, each starting with a RESYNC) and the pins.
    ``truncate``: cut the torn tail off the file too, so the next scan is clean."""
    directory = Path(directory)
    segs = list(iter_segment_paths(directory))
    records: list[Record] = []
    records_cut, cut, mtime = 0, "", 0.0
    for i, path in enumerate(reversed(segs)):  # newest first, until enough records
        blob = path.read_bytes()
        if i == 0:
            mtime = path.stat().st_mtime
        try:
            recs, err = scan(path, blob, layout, meta_of)
        except LogCorrupt:
            if i == 0 and is_torn_header(blob, layout):  # a kill while the newest segment was created
                records_cut, cut = 0, f"{path.name}: {len(blob)} bytes of a segment that never got a record"
                if truncate:
                    path.unlink()
                continue
            raise
        if err is not None:
            if i != 0:
                raise err
            after = valid_record_after(path, blob, err.offset, layout, meta_of)
            if after is not None:  # damage with good records behind it: cutting there would throw them away
                raise LogCorrupt(path, err.offset, f"{err.why}; valid records follow at offset {after}, so this "
                                                   "is damage inside the log, not a torn tail")
            records_cut, cut = 1, f"{path.name} at offset {err.offset} ({err.why}, {len(blob) - err.offset} bytes)"
            if truncate:
                os.truncate(path, err.offset)
        records[:0] = recs
        if len(records) > keep and records[0].kind == RESYNC:
            break
    pins = []
    for path in iter_segment_paths(directory, "pin-"):
        recs, err = scan(path, path.read_bytes(), layout, meta_of)
        if err is not None or len(recs) != 1 or recs[0].kind != RESYNC:
            raise err or LogCorrupt(path, 0, "a pin file holds exactly one RESYNC record")
        if path.name != pin_name(recs[0].id):  # also: one pin file per capsule
            raise LogCorrupt(path, recs[0].offset, f"the pin file holds capsule {recs[0].id}, not the one it is "
                                                   "named for")
        pins.append(recs[0])
    last = records[-1].kind if records else 0  # the last word: a marker, or the newest capsule
    live_id = records[-1].id if last == LIVE else 0
    records = [r for r in records if r.kind not in MARKERS]
    check_timeline(records)
    max_id = max([r.id for r in records] + [r.id for r in pins], default=0)
    return LogContents(records, pins, records_cut, cut, mtime, max_id, live_id, last == RESET)


def check_timeline(records: list[Record]) -> None:
    """The order the writer gives the records, checked before a rebuild reads through them: ids strictly
    increase, the oldest stands alone, and each DELTA extends the record right before it (its parent, the
    step its entries start at). Checksums alone let a removed, repeated or reordered record through."""
    for prev, rec in zip([None, *records], records):
        if prev is None:
            if rec.kind != RESYNC:
                raise LogCorrupt(rec.path, rec.offset, "the oldest segment does not start with a RESYNC record")
            continue
        if rec.id <= prev.id:
            raise LogCorrupt(rec.path, rec.offset, f"capsule id {rec.id} after {prev.id}: ids must increase")
        if rec.kind != RESYNC and (rec.parent_id != prev.id or rec.step - len(rec.kv) != prev.step):
            raise LogCorrupt(rec.path, rec.offset, f"a delta of capsule {rec.parent_id} at step "
                                                   f"{rec.step - len(rec.kv)} follows capsule {prev.id} at step "
                                                   f"{prev.step}: a record is missing or out of order")


def rebuild(session, contents: LogContents) -> ResumeReport:
    """Make ``session`` the crashed node's: the store's capsules from the log, the newest live."""
    t0 = time.perf_counter()
    store, backend = session.store, session.backend
    _check_ids(contents)  # before anything is touched: a refused log leaves the session as it was
    with session.branch_lock, session.lock, backend.activate():  # the session's lock order (reset inside)
        try:
            _rebuild_store(session, contents)
        except ValueError as e:  # the checks above missed something: never a half-rebuilt session
            session.reset()
            store.clear()
            raise LogCorrupt(Path(contents.records[0].path if contents.records else "?"), 0,
                             f"the log cannot be rebuilt ({e}); the session is left reset, with no capsules") from None
        except CapsuleError as e:  # the log is sound but this store is smaller (capacity, budget): start clean
            session.reset()
            store.clear()
            raise ResumeDoesNotFit(f"resume: the log's capsules do not fit this capsule store ({e}); raise "
                                   "capsule_capacity or capsule_budget_mb, or start fresh. The session is "
                                   "left reset, with no capsules") from None
        live = contents.records[-1] if contents.records else max(contents.pins, key=lambda r: r.id, default=None)
        marked = [r for r in contents.records + contents.pins if r.id == contents.live_id and r.id in store]
        live = marked[0] if marked else live  # a rollback before the crash: its capsule, if the store kept it
        if contents.reset:  # a reset before the crash: the capsules, and no live one
            live = None
            session.reset()
        if live is not None:
            store.restore(live.id, 0)
            session._step, session._live_id = live.step, live.id
        store.continue_ids_after(contents.max_id)
        store.mark_resumed()
        for info in store.list():
            session.history.mark(info.id, None)  # the observations before the crash are not known
        backend.sync()
    return ResumeReport(live.id if live else 0, live.step if live else 0, live.stamp_ns if live else 0,
                        max(0.0, time.time() - contents.newest_mtime) if contents.newest_mtime else 0.0,
                        len(contents.records), contents.records_cut, contents.cut, len(store),
                        sum(i.pinned for i in store.list()), (time.perf_counter() - t0) * 1e3)


def _check_ids(contents: LogContents) -> None:
    """Every capsule the rebuild takes has an id of its own (check_timeline orders the timeline; a pin
    file on it is the same capsule)."""
    timeline = {rec.id for rec in contents.records}
    seen: set[int] = set()
    for rec in [*(p for p in contents.pins if p.id not in timeline), *contents.records]:
        if rec.id in seen:
            raise LogCorrupt(rec.path, rec.offset, f"capsule {rec.id} is recorded twice")
        seen.add(rec.id)


def _rebuild_store(session, contents: LogContents) -> None:
    store = session.store
    session.reset()
    store.clear()  # a session that stepped on its own holds capsules under the log's ids
    # A pin on the timeline is pinned when the timeline passes it, so it shares its window's pages with
    # its neighbours as it did before the crash. Only the other pins are loaded from their files, oldest
    # first, each sharing the pages of the pin before it where their windows hold the same entries.
    timeline = {rec.id for rec in contents.records}
    pinned = {rec.id for rec in contents.pins}

    def sources(rec):  # what the running store made it from: its parent, else what came right before it,
        # else a pin rebuilt earlier (pins taken on two branches in turn: the one before is the other branch's)
        return [*([store.pages_of(rec.parent_id)] if rec.parent_id in store else []), session.kv.tables[0],
                *(store.pages_of(info.id) for info in store.list(pinned_only=True))]

    for rec in sorted(contents.pins, key=lambda r: r.id):
        if rec.id in timeline:
            continue
        load_row(session, rec, sources(rec))
        store.snapshot(0, step=rec.step, parent_id=rec.parent_id, stamp_ns=rec.stamp_ns, label=rec.label,
                       pin=True, cid=rec.id)
    for rec in contents.records:
        if rec.kind == RESYNC:  # a rollback, a commit, a new segment: shares pages where entries are equal
            load_row(session, rec, sources(rec))
        else:
            append_row(session, rec)
        store.snapshot(0, step=rec.step, parent_id=rec.parent_id, stamp_ns=rec.stamp_ns, label=rec.label,
                       pin=rec.id in pinned, cid=rec.id)


def load_row(session, rec: Record, candidates) -> None:
    """Row 0 becomes the record's state. Its window shares the pages of the candidate page table (the
    record's parent, what the row held before) that holds, bit for bit, the longest run of the record's
    entries from the window's start, and re-enacts the steps after that run as the step made them
    (copy-on-write where the candidate wrote past it): the sharing the running store had. With nothing
    shared, the window is loaded into fresh pages."""
    kv, W = session.kv, session.cfg.kv_window
    best, until = None, rec.step - min(rec.step, W)
    for pages in candidates:
        shared = _shared_until(session, pages, rec)
        if shared > until:
            best, until = pages, shared
    if best is None:  # nothing shared from the start: the window may still continue a page's free tail,
        # the fullest such page: the one the running store's live row went on appending into, most likely
        tails = [(int(kv.fill[page]), -i, pages) for i, pages in enumerate(candidates)
                 if (page := _continued_page(session, pages, rec)) is not None]
        if tails:
            best = max(tails, key=lambda tail: tail[:2])[2]
            kv.fill[_continued_page(session, best, rec)] = until % KV_PAGE  # the next append: the window's first slot
    if best is not None:
        kv.set_row(0, best.copy())
        for pos in range(until, rec.step):
            kv.prepare_append(0, pos)
            kv.write_entry(0, pos, rec.kv[:, :, pos % W])
        session.backend.from_host(session.arena.state[0], rec.small)
        kv.rewrite_device_table(0)  # the record's kv_pages are in the old process's numbering
        return
    session.backend.from_host(session.arena.state[0], rec.small)
    windows = [(rec.kv[layer, 0], rec.kv[layer, 1]) for layer in range(rec.kv.shape[0])]
    table = kv.load(windows, rec.step, min(rec.step, W))
    kv.set_row(0, table)  # also rewrites kv_pages, which the record holds in the old process's numbering
    kv.decref(table)


def _continued_page(session, pages: np.ndarray, rec: Record) -> int | None:
    """The page of ``pages`` the record's window can continue (None: none): the window starts inside it,
    past its fill. So does a pin taken more than kv_window after the one before it: the running store's
    live row had appended the steps between into the page that pin's window ends in. Appending the window
    there (the slots between the fill and the window's start left unwritten) keeps the rebuilt store within
    the pages the running one held. Safe whatever that page held before: every holder reads only slots
    below the old fill, and attention, gather and the files read only slots inside a window."""
    kv, W = session.kv, session.cfg.kv_window
    start = rec.step - min(rec.step, W)
    page = int(np.asarray(pages)[(start // KV_PAGE) % kv.P])
    continues = start < rec.step and start % KV_PAGE > 0 and page >= 0 and kv.fill[page] <= start % KV_PAGE
    return page if continues else None


def _shared_until(session, pages: np.ndarray, rec: Record) -> int:
    """The first position of the record's window, from its start, that ``pages`` does not hold bit for
    bit in a slot that never changes again (below its page's fill: only the fill is ever appended to)."""
    kv, backend, W = session.kv, session.backend, session.cfg.kv_window
    start = rec.step - min(rec.step, W)
    t = np.arange(start, rec.step)
    page, slot = np.asarray(pages)[(t // KV_PAGE) % kv.P], t % KV_PAGE
    stable = page >= 0
    stable[stable] = slot[stable] < kv.fill[page[stable]]
    n = len(t) if stable.all() else int(np.argmin(stable))
    t, page, slot = t[:n], page[:n], slot[:n]
    same = np.ones(n, bool)
    with backend.activate():
        # the first key alone first: most candidates (every pin rebuilt before) differ there, and gathering
        # the whole window from each would make a resume with many pins quadratic in window reads
        if n and (backend.to_host(kv.k[0][page[0], slot[0]]).view(np.uint32)
                  != rec.kv[0, 0, t[0] % W].view(np.uint32)).any():
            return start
        for layer, (k, v) in enumerate(zip(kv.k, kv.v)):
            for log, j in ((k, 0), (v, 1)):
                have = backend.to_host(log[page, slot]) if n else np.zeros((0, log.shape[2]), np.float32)
                same &= (have.view(np.uint32) == rec.kv[layer, j, t % W].view(np.uint32)).all(axis=1)
    return start + (n if same.all() else int(np.argmin(same)))


def append_row(session, rec: Record) -> None:
    kv, backend = session.kv, session.backend
    for i, pos in enumerate(range(rec.step - rec.kv.shape[0], rec.step)):
        kv.prepare_append(0, pos)
        kv.write_entry(0, pos, rec.kv[i])
    backend.from_host(session.arena.state[0], rec.small)
    kv.rewrite_device_table(0)


def meta_reader(arena):
    """``meta_of`` for the format's validation: the meta buffer of one small-state row."""
    return lambda small: np.asarray(arena.row_view("meta", small))


__all__ = ["LogContents", "ResumeDoesNotFit", "ResumeReport", "append_row", "check_timeline", "load_row", "meta_reader",
           "read_log", "rebuild"]
