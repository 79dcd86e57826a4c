"""CapsuleStore: a preallocated ring of state-row copies with lineage, pins and a byte budget.

A capsule is one slot (one contiguous copy of a state row) plus its CapsuleInfo. Slots live in the
backend's memory (GPU memory on CUDA); nothing is allocated per snapshot. When every slot is used,
the oldest unpinned capsule is evicted. Ids are monotonic and never reused; 0 means "none".
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

FORMAT = "flashrt-capsule/1"


class CapsuleError(Exception):
    """Base of every capsule failure; the live state is untouched when one is raised."""


class UnknownCapsule(CapsuleError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return str(self.args[0])


class FingerprintMismatch(CapsuleError):
    pass


class CorruptCapsule(CapsuleError):
    pass


class StoreFullOfPins(CapsuleError):
    pass


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
    def __init__(self, backend, row_nbytes: int, capacity: int, budget_bytes: float, fingerprint: str):
        fit = int(budget_bytes // row_nbytes)
        if fit < 1:
            raise ValueError(f"capsule_budget_mb: {budget_bytes / 2**20:.1f} MB cannot hold one capsule "
                             f"of {row_nbytes / 2**20:.2f} MB")
        self.backend = backend
        self.row_nbytes = row_nbytes
        self.capacity = min(capacity, fit)
        self.budget_bytes = int(budget_bytes)
        self.fingerprint = fingerprint
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

    def set_pinned(self, cid: int, pinned: bool) -> CapsuleInfo:
        info = replace(self.get(cid), pinned=pinned)
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
    def export(self, cid: int, path: str | Path, arena) -> str:
        """safetensors: one tensor per state buffer + metadata (info, fingerprint, sha256). Returns sha256."""
        from safetensors.numpy import save_file

        info = self.get(cid)
        row = self.backend.to_host(self.slots[self._slot[cid]])
        digest = hashlib.sha256(row.tobytes()).hexdigest()
        tensors = {s.name: np.ascontiguousarray(arena.row_view(s.name, row)) for s in arena.state_specs()}
        meta = {"format": FORMAT, "info": json.dumps(asdict(info)), "fingerprint": info.fingerprint,
                "sha256": digest}
        tmp = Path(str(path) + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        tmp.replace(path)
        return digest

    def read_file(self, path: str | Path, arena) -> tuple[np.ndarray, dict]:
        """Validate a capsule file completely; returns (host row bytes, info dict). Touches nothing."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except FileNotFoundError:
            raise CorruptCapsule(f"{path}: no such file") from None
        except (OSError, SafetensorError, ValueError, RuntimeError) as e:
            raise CorruptCapsule(f"{path}: not a readable safetensors file ({e})") from None
        if meta.get("format") != FORMAT:
            raise CorruptCapsule(f"{path}: not a flashrt capsule (format {meta.get('format')!r})")
        if meta.get("fingerprint") != self.fingerprint:
            raise FingerprintMismatch(f"{path}: fingerprint {str(meta.get('fingerprint'))[:12]} does not match "
                                      f"this policy's {self.fingerprint[:12]} (other config, weights or plan)")
        try:
            info = json.loads(meta["info"])
            expected_sha = meta["sha256"]
        except (KeyError, ValueError) as e:
            raise CorruptCapsule(f"{path}: bad metadata ({e})") from None
        specs = arena.state_specs()
        if set(tensors) != {s.name for s in specs}:
            raise CorruptCapsule(f"{path}: buffers {sorted(tensors)[:4]}... do not match the state table")
        row = np.zeros(self.row_nbytes, np.uint8)
        for s in specs:
            t = tensors[s.name]
            if t.shape != s.shape or t.dtype != np.dtype(s.dtype):
                raise CorruptCapsule(f"{path}: {s.name} is {t.dtype}{list(t.shape)}, expected {s.dtype}{list(s.shape)}")
            arena.row_view(s.name, row)[...] = t
        if hashlib.sha256(row.tobytes()).hexdigest() != expected_sha:
            raise CorruptCapsule(f"{path}: checksum mismatch: the state bytes were altered")
        return row, info

    def import_(self, path: str | Path, arena, label: str | None = None) -> CapsuleInfo:
        row, info = self.read_file(path, arena)
        slot = self._take_slot()
        self.backend.from_host(self.slots[slot], row)
        return self._add(slot, 0, int(info.get("step", 0)), int(info.get("stamp_ns", 0)),
                         label if label is not None else str(info.get("label", "")), False)
