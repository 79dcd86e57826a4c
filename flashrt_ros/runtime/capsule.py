"""CapsuleStore: a preallocated ring of state-row copies with lineage, pins and a byte budget.

A capsule is one slot (one contiguous copy of a state row) plus its CapsuleInfo. Slots live in the
backend's memory (GPU memory on CUDA); nothing is allocated per snapshot. When every slot is used,
the oldest unpinned capsule is evicted. Ids are monotonic and never reused; 0 means "none".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .capsule_file import CapsulePayload, read_capsule_file, write_capsule_file
from .errors import CapsuleError, CapsuleInUse, CorruptCapsule, FingerprintMismatch, StoreFullOfPins, UnknownCapsule

__all__ = ["CapsuleError", "CapsuleInUse", "CapsuleInfo", "CapsuleStore", "CorruptCapsule", "FingerprintMismatch",
           "StoreFullOfPins", "StoreUsage", "UnknownCapsule", "write_capsule_file"]


@dataclass(frozen=True)
class StoreUsage:
    capsules: int
    pinned: int
    capacity: int  # capsules the store can hold
    bytes_used: int
    budget_bytes: int
    oldest_step: int  # step of the oldest restorable capsule (-1: none)
    newest_step: int
    log_entries_used: int  # KV log entries holding some capsule's window
    log_entries_total: int

    @property
    def rollback_depth_steps(self) -> int:
        """How many steps back the oldest restorable capsule is (0 when there is none)."""
        return max(0, self.newest_step - self.oldest_step) if self.capsules else 0


@dataclass(frozen=True)
class CapsuleInfo:
    id: int
    parent_id: int
    step: int  # policy steps taken when this state was captured
    stamp_ns: int  # stamp of the observation that produced this state
    label: str
    pinned: bool
    nbytes: int
    fingerprint: str


class CapsuleStore:
    def __init__(self, backend, row_nbytes: int, capacity: int, budget_bytes: float, fingerprint: str,
                 kv_window: int, reserve: int = 1):
        fit = int(budget_bytes // row_nbytes)
        if fit < 1:
            raise ValueError(f"capsule_budget_mb: {budget_bytes / 2**20:.1f} MB cannot hold one capsule "
                             f"of {row_nbytes / 2**20:.2f} MB")
        self.backend = backend
        self.row_nbytes = row_nbytes
        self.capacity = min(capacity, fit)
        self.budget_bytes = int(budget_bytes)
        self.fingerprint = fingerprint
        self.kv_window = kv_window
        self.reserve = reserve  # slots pins may never take: the live step's and a replan's capsules
        self.slots = backend.zeros((self.capacity, row_nbytes), np.uint8)  # [capacity, row_nbytes]
        with backend.activate():
            self.slots.fill(1)  # fault every page in now, not on the first snapshot of each slot
            self.slots.fill(0)
        backend.sync()
        self._free = list(range(self.capacity - 1, -1, -1))
        self._info: dict[int, CapsuleInfo] = {}  # insertion order = age
        self._slot: dict[int, int] = {}
        self._next_id = 1

    # ---- queries --------------------------------------------------------------------------
    def __contains__(self, cid: int) -> bool:
        return cid in self._info

    def __len__(self) -> int:
        return len(self._info)

    @property
    def bytes_used(self) -> int:
        return len(self._info) * self.row_nbytes

    def get(self, cid: int) -> CapsuleInfo:
        info = self._info.get(cid)
        if info is None:
            if 0 < cid < self._next_id:
                raise UnknownCapsule(f"capsule {cid} was evicted or dropped")
            raise UnknownCapsule(f"unknown capsule id {cid}")
        return info

    def list(self, pinned_only: bool = False) -> list[CapsuleInfo]:
        return [i for i in self._info.values() if i.pinned or not pinned_only]

    def slot(self, cid: int):
        self.get(cid)
        return self.slots[self._slot[cid]]

    # ---- mutation -------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        victim = next((cid for cid, i in self._info.items() if not i.pinned), None)
        if victim is None:
            raise StoreFullOfPins(f"capsule store full: all {self.capacity} capsules are pinned; unpin or drop one")
        del self._info[victim]
        return self._slot.pop(victim)

    def _add(self, slot: int, parent_id: int, step: int, stamp_ns: int, label: str, pin: bool) -> CapsuleInfo:
        info = CapsuleInfo(self._next_id, parent_id, step, stamp_ns, label, pin, self.row_nbytes, self.fingerprint)
        self._next_id += 1
        self._info[info.id] = info
        self._slot[info.id] = slot
        return info

    def snapshot(self, src_row, *, step: int, parent_id: int = 0, stamp_ns: int = 0, label: str = "",
                 pin: bool = False) -> CapsuleInfo:
        """One copy of a state row into a slot."""
        slot = self._take_slot()
        self.backend.copy(self.slots[slot], src_row)
        return self._add(slot, parent_id, step, stamp_ns, label, pin)

    def restore(self, cid: int, dst_row) -> CapsuleInfo:
        info = self.get(cid)
        self.backend.copy(dst_row, self.slots[self._slot[cid]])
        return info

    def fork(self, cid: int, label: str = "") -> CapsuleInfo:
        """A new capsule with the same bytes, whose parent is ``cid``: an independent branch point."""
        src = self.get(cid)
        self._info[cid] = replace(src, pinned=True)  # the source must not be the one evicted
        try:
            slot = self._take_slot()
        finally:
            self._info[cid] = src
        self.backend.copy(self.slots[slot], self.slots[self._slot[cid]])
        return self._add(slot, cid, src.step, src.stamp_ns, label or f"fork of {cid}", False)

    def drop(self, cid: int) -> None:
        self.get(cid)
        del self._info[cid]
        self._free.append(self._slot.pop(cid))

    def check_pin_allowed(self) -> None:
        pinned = sum(i.pinned for i in self._info.values())
        if pinned + 1 > self.capacity - self.reserve:
            raise StoreFullOfPins(f"pin refused: {pinned} of {self.capacity} capsules are pinned and "
                                  f"{self.reserve} must stay free for the live step and a replan; unpin one")

    def usage(self) -> StoreUsage:
        steps = [i.step for i in self._info.values()]
        return StoreUsage(len(self._info), sum(i.pinned for i in self._info.values()), self.capacity,
                          self.bytes_used, self.budget_bytes, min(steps, default=-1), max(steps, default=-1),
                          len(self._info) * self.kv_window, self.capacity * self.kv_window)

    def set_pinned(self, cid: int, pinned: bool) -> CapsuleInfo:
        cur = self.get(cid)
        if pinned and not cur.pinned:
            self.check_pin_allowed()
        info = replace(cur, pinned=pinned)
        self._info[cid] = info
        return info

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

    # ---- files ----------------------------------------------------------------------------
    def export_payload(self, cid: int, arena) -> CapsulePayload:
        """A host copy of the capsule, ready for write_capsule_file (no file I/O here)."""
        info = self.get(cid)
        row = self.backend.to_host(self.slots[self._slot[cid]])
        tensors = {s.name: np.array(arena.row_view(s.name, row)) for s in arena.state_specs()}
        return CapsulePayload(tensors, asdict(info))

    def read_file(self, path: str | Path, arena) -> CapsulePayload:
        """Validate a capsule file completely; touches nothing (safe without the session lock)."""
        return read_capsule_file(path, arena.state_specs(), self.fingerprint, self.kv_window)

    def add_imported(self, payload: CapsulePayload, arena) -> CapsuleInfo:
        row = np.zeros(self.row_nbytes, np.uint8)
        for name, t in payload.tensors.items():
            arena.row_view(name, row)[...] = t
        slot = self._take_slot()
        self.backend.from_host(self.slots[slot], row)
        info = payload.info
        return self._add(slot, 0, info["step"], info["stamp_ns"], info["label"], False)
