"""CapsuleStore: capsules as small-state records over the shared KV log, with lineage, pins and a budget.

A capsule is one record (a copy of a row's small state: recurrent, conv, mtp, meta and the KV page
table, a few KiB) plus references to the log pages of its window (kv_log.py) and a CapsuleInfo.
Records and pages are preallocated in the backend's memory; nothing is allocated per snapshot.

When records or log pages run out, the oldest unpinned capsules are evicted. Ids are monotonic and
never reused; 0 means "none". A pin keeps the capsule's record and every page of its window: a pin is
refused up front when keeping it could leave the live step (or a replan) without room, so pins never
lose data and never wedge the live step.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import CapsuleError, CapsuleInUse, CorruptCapsule, FingerprintMismatch, StoreFullOfPins, UnknownCapsule
from ..model.kernels import META_KV_LEN, META_POS
from .capsule_file import CapsulePayload, read_capsule_file, write_capsule_file
from .kv_log import KvLog, LogFull

__all__ = ["CapsuleError", "CapsuleInUse", "CapsuleInfo", "CapsuleStore", "CorruptCapsule", "FingerprintMismatch",
           "LogFull", "StoreFullOfPins", "StoreUsage", "UnknownCapsule", "write_capsule_file"]


@dataclass(frozen=True)
class StoreUsage:
    capsules: int
    pinned: int
    capacity: int  # capsule records
    bytes_used: int  # records in use + log pages in use
    budget_bytes: int
    oldest_step: int  # step of the oldest restorable capsule (-1: none)
    newest_step: int
    log_entries_used: int  # KV log entries in pages that some capsule or row holds
    log_entries_total: int

    @property
    def rollback_depth_steps(self) -> int:
        """How many steps back the oldest restorable capsule is (0 when there is none)."""
        return max(0, self.newest_step - self.oldest_step) if self.capsules else 0


@dataclass(frozen=True, slots=True)
class CapsuleInfo:
    id: int
    parent_id: int
    step: int  # policy steps taken when this state was captured
    stamp_ns: int  # stamp of the observation that produced this state
    label: str
    pinned: bool
    nbytes: int  # what this capsule adds to the store: its record plus one KV entry per layer
    fingerprint: str
    resumed: bool = False  # rebuilt from the persisted log when the session started (resume)


@dataclass(slots=True)
class _Capsule:
    info: CapsuleInfo
    record: int
    pages: np.ndarray  # [P] int64: the page table of its window (-1 = none)


class CapsuleStore:
    def __init__(self, backend, arena, kv: KvLog, capacity: int, budget_bytes: int, fingerprint: str,
                 kv_window: int, window_specs, reserve_records: int, reserve_pages: int, entry_nbytes: int):
        self.backend = backend
        self.arena = arena
        self.kv = kv
        self.row_nbytes = arena.row_nbytes
        self.capacity = capacity
        self.budget_bytes = int(budget_bytes)
        self.fingerprint = fingerprint
        self.kv_window = kv_window
        self.window_specs = list(window_specs)  # the materialised row: what files and the oracle hold
        self.reserve_records = reserve_records  # records pins may never take (the live step, a replan)
        self.reserve_pages = reserve_pages  # log pages pins may never take
        self.capsule_nbytes = self.row_nbytes + entry_nbytes
        self.page_nbytes = entry_nbytes * kv.k[0].shape[1] if kv.k else 0
        self.records = backend.zeros((capacity, self.row_nbytes), np.uint8)  # [capacity, row_nbytes]
        with backend.activate():
            self.records.fill(1)  # fault every page in now, not on the first snapshot of each record
            self.records.fill(0)
        backend.sync()
        self._free = deque(range(capacity))
        self._caps: dict[int, _Capsule] = {}  # insertion order = age
        self._what_ifs: dict[int, None] = {}  # the what-if capsules among them, oldest first
        # kept as capsules come and go, so that usage() (diagnostics, every second, under the session lock) and
        # the pin checks cost O(pins) or a short walk instead of a pass over every capsule
        self._pinned: dict[int, None] = {}  # the pinned ones
        # capsules held per step, and bounds on the oldest and newest of those steps (a new capsule moves them out;
        # usage() walks them in to the first step held): no pass over the store on the step (_extreme_step)
        self._at_step: dict[int, int] = {}
        self._oldest_at_or_after = self._newest_at_or_before = 0
        self._held: list[np.ndarray] = []  # page tables read outside the session lock (hold_pages)
        self._next_id = 1
        # a new id at or past id_watch is shown to on_id_watch first (persistence reserves ids ahead of
        # their use, durably: persistence.IdReservation); never without persistence
        self.id_watch: float = float("inf")
        self.on_id_watch: Callable[[int], None] = lambda cid: None
        self.on_release: Callable[[int], None] = lambda cid: None  # told of every capsule evicted or dropped
        kv.evict_one = self._evict_oldest

    # ---- queries --------------------------------------------------------------------------
    def __contains__(self, cid: int) -> bool:
        return cid in self._caps

    def __len__(self) -> int:
        return len(self._caps)

    def _cap(self, cid: int) -> _Capsule:
        cap = self._caps.get(cid)
        if cap is None:
            if 0 < cid < self._next_id:
                raise UnknownCapsule(f"capsule {cid} was evicted or dropped")
            raise UnknownCapsule(f"unknown capsule id {cid}")
        return cap

    def is_pinned(self, cid: int) -> bool:
        """Safe without the session lock (one dict lookup, a frozen info): the pin files ask it."""
        cap = self._caps.get(cid)
        return cap is not None and cap.info.pinned

    def get(self, cid: int) -> CapsuleInfo:
        return self._cap(cid).info

    def list(self, pinned_only: bool = False) -> list[CapsuleInfo]:
        return [c.info for c in self._caps.values() if c.info.pinned or not pinned_only]

    def pages_of(self, cid: int) -> np.ndarray:
        return self._cap(cid).pages

    def record(self, cid: int):
        return self.records[self._cap(cid).record]

    def usage(self) -> StoreUsage:
        page_len = self.kv.k[0].shape[1]
        return StoreUsage(len(self._caps), len(self._pinned), self.capacity,
                          len(self._caps) * self.row_nbytes + self.kv.pages_used * self.page_nbytes,
                          self.budget_bytes, self._extreme_step(1), self._extreme_step(-1),
                          self.kv.pages_used * page_len, self.kv.n_pages * page_len)

    STEP_WALK = 256  # steps usage() walks from a bound before it takes min / max over every step held

    def _extreme_step(self, sign: int) -> int:
        """The oldest (sign 1) or newest (-1) step held, -1 when none. Captures mostly come one step apart, so
        the walk from the bound is short; past STEP_WALK steps (a gap: a range dropped) one pass finds it."""
        if not self._at_step:
            return -1
        at = self._oldest_at_or_after if sign == 1 else self._newest_at_or_before
        for _ in range(self.STEP_WALK):
            if at in self._at_step:
                break
            at += sign
        else:
            at = min(self._at_step) if sign == 1 else max(self._at_step)
        if sign == 1:
            self._oldest_at_or_after = at
        else:
            self._newest_at_or_before = at
        return at

    # ---- eviction -------------------------------------------------------------------------
    def _evict_oldest(self) -> bool:
        """Free the oldest unpinned what-if capsule (a replan branch nobody committed), else the oldest
        unpinned capsule: what-ifs, which hold private pages, never eat the timeline's rollback depth.
        Both scans stop at the first unpinned capsule: O(pins), not O(capsules), on the live step."""
        victim = next((cid for cid in self._what_ifs if not self._caps[cid].info.pinned), None)
        if victim is None:
            victim = next((cid for cid, c in self._caps.items() if not c.info.pinned), None)
        if victim is None:
            return False
        self._release(victim)
        return True

    def _release(self, cid: int) -> None:
        self._what_ifs.pop(cid, None)
        self._pinned.pop(cid, None)
        cap = self._caps.pop(cid)
        step = cap.info.step
        held_there = self._at_step[step] - 1
        if held_there:
            self._at_step[step] = held_there
        else:
            del self._at_step[step]
        self._free.append(cap.record)
        self.kv.decref(cap.pages)
        self.on_release(cid)

    def _take_record(self) -> int:
        while not self._free:
            if not self._evict_oldest():
                raise StoreFullOfPins(f"capsule store full: all {self.capacity} capsules are pinned; unpin or "
                                      "drop one")
        return self._free.popleft()

    def _add(self, record: int, pages: np.ndarray, parent_id: int, step: int, stamp_ns: int, label: str,
             pin: bool, cid: int | None = None) -> CapsuleInfo:
        if cid is None:
            cid = self._next_id
            if cid >= self.id_watch:
                self.on_id_watch(cid)
        info = CapsuleInfo(cid, parent_id, step, stamp_ns, label, pin, self.capsule_nbytes, self.fingerprint)
        if cid >= self._next_id:
            self._next_id = cid + 1
        self._caps[cid] = _Capsule(info, record, pages)
        if pin:
            self._pinned[cid] = None
        elif self._pinned:  # an id given again (a re-anchor) takes the new entry's pin
            self._pinned.pop(cid, None)
        # inline: the live step runs this with cold caches, ~1 us a call
        self._at_step[step] = self._at_step.get(step, 0) + 1
        if step < self._oldest_at_or_after or len(self._caps) == 1:  # 1: the store was empty, the bounds stale
            self._oldest_at_or_after = step
        if step > self._newest_at_or_before or len(self._caps) == 1:
            self._newest_at_or_before = step
        return info

    # ---- capsules -------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every capsule, pinned ones too (a resume replaces the store with the log's). Ids go on."""
        for cid in list(self._caps):
            self._release(cid)

    def mark_resumed(self) -> None:
        """Every capsule held now came from the persisted log."""
        for cap in self._caps.values():
            cap.info = replace(cap.info, resumed=True)

    @property
    def next_id(self) -> int:
        """The id the next new capsule gets."""
        return self._next_id

    def continue_ids_after(self, max_id: int) -> None:
        """New ids start past ``max_id`` (a persisted log's): an id is never reused, across restarts too."""
        self._next_id = max(self._next_id, max_id + 1)

    def number_after(self, max_id: int, below: int) -> None:
        """New ids start right after ``max_id``, below the held ids from ``below`` on (a replica's what-ifs):
        a standby that takes over continues the primary's numbering. No held id may lie between."""
        if any(max_id < cid < below for cid in self._caps):
            raise ValueError(f"ids after {max_id} are held already")
        self._next_id = max_id + 1

    def snapshot(self, row: int, *, step: int, parent_id: int = 0, stamp_ns: int = 0, label: str = "",
                 pin: bool = False, cid: int | None = None) -> CapsuleInfo:
        """One copy of the row's small state, plus references to the pages of its window. ``cid``: the
        id to give it (a resumed capsule keeps its own); None = the next one."""
        if cid is not None and (cid <= 0 or cid in self._caps):
            raise ValueError(f"capsule id {cid}: already taken or not an id")
        if pin:
            self.check_pin_allowed(self.kv.tables[row])
        # after every live step, with the caches just flushed by the step: each Python call here costs ~1 us,
        # so the common case (a free record) takes no call to find one
        record = self._free.popleft() if self._free else self._take_record()
        self.backend.copy(self.records[record], self.arena.state[row])
        pages = self.kv.tables[row].copy()
        self.kv.incref(pages)
        return self._add(record, pages, parent_id, step, stamp_ns, label, pin, cid)

    def mark_what_if(self, ids) -> None:
        """Replan branches nobody committed: evicted before the timeline's capsules (see _evict_oldest)."""
        for cid in ids:
            if cid in self._caps:
                self._what_ifs[cid] = None

    def restore(self, cid: int, row: int, count: int = 1) -> CapsuleInfo:
        """Make ``row`` (rows row..row+count-1: a replan's branches) the capsule's state: one small copy each;
        the window is shared, not copied."""
        cap = self._cap(cid)
        for r in range(row, row + count):
            self.backend.copy(self.arena.state[r], self.records[cap.record])
        self.kv.set_row(row, cap.pages, count)
        if row == 0:
            self._what_ifs.pop(cid, None)  # live now: part of the timeline
        return cap.info

    def restore_buffers(self, cid: int, row: int, names: set[str]) -> CapsuleInfo:
        """Restore only the named small-state buffers (the KV-only ablation); ``kv_pages`` moves the window."""
        cap = self._cap(cid)
        dst, src = self.arena.state[row], self.records[cap.record]
        for name in names:
            p = self.arena.placements[name]
            span = slice(p.offset, p.offset + p.spec.nbytes)
            self.backend.copy(dst[span], src[span])
        if "kv_pages" in names:
            self.kv.set_row(row, cap.pages)
        return cap.info

    def fork(self, cid: int, label: str = "") -> CapsuleInfo:
        """A new capsule with the same state, whose parent is ``cid``: an independent branch point."""
        src = self._cap(cid)
        was = src.info
        src.info = replace(was, pinned=True)  # the source must not be the one evicted for the record
        try:
            record = self._take_record()
        finally:
            src.info = was
        self.backend.copy(self.records[record], self.records[src.record])
        pages = src.pages.copy()
        self.kv.incref(pages)
        return self._add(record, pages, cid, was.step, was.stamp_ns, label or f"fork of {cid}", False)

    def drop(self, cid: int) -> None:
        self._cap(cid)
        self._release(cid)

    def hold_pages(self, cid: int) -> np.ndarray | None:
        """A reference to every page of the capsule's window, so a file writer can gather it without the
        session lock (an entry never changes while its page is referenced); counted like a pin's pages
        until release_pages. None, holding nothing, when that would take pages a pin could not (the
        caller then copies under the lock). Also None on a device backend: there the gather is a fast device
        copy on the runtime stream, which must not interleave with a replan runner's graph capture."""
        if self.backend.xp is not np:
            return None
        pages = self._cap(cid).pages.copy()
        held = {int(p) for t in [*self._pinned_tables(), *self._held, pages] for p in t if p >= 0}
        if len(held) + self.reserve_pages > self.kv.n_pages:
            return None
        self.kv.incref(pages)
        self._held.append(pages)
        return pages

    def release_pages(self, pages: np.ndarray) -> None:
        self._held = [t for t in self._held if t is not pages]
        self.kv.decref(pages)

    def _pinned_tables(self) -> list[np.ndarray]:
        return [self._caps[cid].pages for cid in self._pinned]

    def check_pin_allowed(self, pages: np.ndarray | None = None) -> None:
        """Refuse a pin (before anything changes) that could starve the live step or a replan."""
        if len(self._pinned) + 1 > self.capacity - self.reserve_records:
            raise StoreFullOfPins(f"pin refused: {len(self._pinned)} of {self.capacity} capsules are pinned and "
                                  f"{self.reserve_records} must stay free for the live step and a replan; unpin one")
        held = {int(p) for t in [*self._pinned_tables(), *self._held] for p in t if p >= 0}
        if pages is not None:
            held |= {int(p) for p in pages if p >= 0}
        if len(held) + self.reserve_pages > self.kv.n_pages:
            raise StoreFullOfPins(f"pin refused: pinned capsules would hold {len(held)} of {self.kv.n_pages} KV log "
                                  f"pages and {self.reserve_pages} must stay free for the live step and a replan; "
                                  "unpin one")

    def check_room(self, pages_needed: int, what: str, keep=()) -> None:
        """Refuse up front (LogFull, nothing changed) an operation that needs more fresh log pages than
        evicting every unpinned capsule could give: it would otherwise throw the rollback history away
        and fail anyway. ``keep``: page tables that stay held besides the pins and the rows."""
        held = self._pinned_tables() + self._held + list(keep)
        have = self.kv.pages_obtainable(held)
        if pages_needed > have:
            raise LogFull(f"{what} needs {pages_needed} KV log pages and at most {have} can be freed (the rest "
                          "hold pinned capsules and the live window): unpin capsules, or ask for less")

    def set_pinned(self, cid: int, pinned: bool) -> CapsuleInfo:
        cap = self._cap(cid)
        if pinned and not cap.info.pinned:
            self.check_pin_allowed(cap.pages)
        cap.info = replace(cap.info, pinned=pinned)
        if pinned:
            self._pinned[cid] = None
        else:
            self._pinned.pop(cid, None)
        return cap.info

    def pin(self, cid: int) -> CapsuleInfo:
        return self.set_pinned(cid, True)

    def unpin(self, cid: int) -> CapsuleInfo:
        return self.set_pinned(cid, False)

    def ancestor(self, cid: int, target_step: int) -> CapsuleInfo:
        """The newest capsule on ``cid``'s lineage (itself included) taken at or before ``target_step``."""
        info = self.get(cid)
        if target_step < 0:
            raise UnknownCapsule(f"cannot go back before step 0 (asked for step {target_step})")
        while info.step > target_step:
            if info.parent_id == 0:
                raise UnknownCapsule(f"no capsule at or before step {target_step}: the lineage starts at "
                                     f"step {info.step}")
            try:
                info = self.get(info.parent_id)
            except UnknownCapsule as e:
                raise UnknownCapsule(f"no capsule at or before step {target_step}: {e}") from None
        return info

    # ---- the materialised state (files, the oracle) --------------------------------------
    def materialize_row(self, small_row: np.ndarray, pages: np.ndarray) -> dict[str, np.ndarray]:
        """The full state a row or capsule stands for: small-state buffers plus the KV window gathered
        from the log as [kv_window, d] (slot = position % kv_window). Host arrays, table order."""
        small = {s.name: np.array(self.arena.row_view(s.name, small_row)) for s in self.arena.state_specs()}
        meta = small["meta"]
        windows = self.kv.gather(pages, int(meta[META_POS]), int(meta[META_KV_LEN]), self.kv_window)
        out = {}
        for s in self.window_specs:
            if s.role == "kv":
                layer = int(s.name.rsplit(".", 1)[1])
                out[s.name] = windows[layer][0 if s.name.startswith("k_") else 1]
            else:
                out[s.name] = small[s.name]
        return out

    def materialize(self, cid: int) -> dict[str, np.ndarray]:
        cap = self._cap(cid)
        return self.materialize_row(self.backend.to_host(self.records[cap.record]), cap.pages)

    # ---- files ----------------------------------------------------------------------------
    def export_payload(self, cid: int) -> CapsulePayload:
        """A host copy of the capsule, ready for write_capsule_file (no file I/O here)."""
        cap = self._cap(cid)
        return self.payload_of(cap.info, self.backend.to_host(self.records[cap.record]), cap.pages)

    def payload_of(self, info: CapsuleInfo, small_row: np.ndarray, pages: np.ndarray) -> CapsulePayload:
        """export_payload from a host copy of the small state and held pages: safe without the session lock."""
        fields = asdict(info)
        fields.pop("resumed")  # how this process got it, not part of the state
        return CapsulePayload(self.materialize_row(small_row, pages), fields)

    def read_file(self, path: str | Path) -> CapsulePayload:
        """Validate a capsule file completely; touches nothing (safe without the session lock)."""
        return read_capsule_file(path, self.window_specs, self.fingerprint, self.kv_window)

    def add_imported(self, payload: CapsulePayload) -> CapsuleInfo:
        """A validated payload becomes a capsule: its window is written into fresh log pages."""
        t = payload.tensors
        row = np.zeros(self.row_nbytes, np.uint8)
        for s in self.arena.state_specs():
            if s.name in t:
                self.arena.row_view(s.name, row)[...] = t[s.name]
        meta = t["meta"]
        n_layers = len(self.kv.k)
        windows = [(t[f"k_cache.{layer}"], t[f"v_cache.{layer}"]) for layer in range(n_layers)]
        pos, kv_len = int(meta[META_POS]), int(meta[META_KV_LEN])
        chunks = len(np.unique(self.kv.window_positions(pos, kv_len) // self.kv.k[0].shape[1]))
        self.check_room(chunks + 1, "this import")  # + 1: the live step's next page
        record = self._take_record()
        try:
            pages = self.kv.load(windows, pos, kv_len)
        except BaseException:
            self._free.appendleft(record)
            raise
        self.arena.row_view("kv_pages", row)[...] = self.kv.device_table(pages)
        self.backend.from_host(self.records[record], row)
        info = payload.info
        return self._add(record, pages, 0, info["step"], info["stamp_ns"], info["label"], False)
