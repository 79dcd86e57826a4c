"""BufferSpec table -> Arena: one state slab, one work slab (io + scratch), one weight slab.

State slab layout is branch-major: ``slab[row]`` holds every state buffer of one row back to back
(aligned), so one row is one contiguous span and a capsule is a single copy of it. A state buffer is
a strided view ``(rows, *shape)`` with row stride = ``row_nbytes``. Row 0 is live; rows 1.. are
replan branches. Views never move: a captured graph holds their addresses.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

STATE_ROLES = ("kv", "recurrent", "conv", "mtp", "meta")
ROLES = STATE_ROLES + ("io", "scratch", "weight")
ALIGN = 256  # bytes; coalesced loads on the GPU, cache lines on the CPU


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]  # per row (state, io, scratch) or whole (weight)
    dtype: str
    role: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: unknown role {self.role!r}")
        if any(int(s) <= 0 for s in self.shape):
            raise ValueError(f"{self.name}: shape must be positive, got {self.shape}")

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def is_state(self) -> bool:
        return self.role in STATE_ROLES


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Placement:
    spec: BufferSpec
    offset: int  # bytes into the row (state) or into the slab (work, weight)


def layout(specs: list[BufferSpec], rows: int) -> tuple[dict[str, Placement], int, int, int]:
    """Offsets for every buffer. Returns (placements, state_row_nbytes, work_nbytes, weight_nbytes)."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate buffer names in {names}")
    place, row, work, weight = {}, 0, 0, 0
    for s in specs:
        if s.is_state:
            place[s.name] = Placement(s, row)
            row += _align(s.nbytes)
        elif s.role == "weight":
            place[s.name] = Placement(s, weight)
            weight += _align(s.nbytes)
        else:
            place[s.name] = Placement(s, work)
            work += _align(s.nbytes * rows)
    return place, row, work, weight


class Arena:
    """All memory of one policy instance, allocated once through a backend."""

    def __init__(self, specs: list[BufferSpec], rows: int, backend):
        self.specs = list(specs)
        self.rows = rows
        self.backend = backend
        self.placements, self.row_nbytes, work_nbytes, weight_nbytes = layout(self.specs, rows)
        self.state = backend.zeros((rows, self.row_nbytes), np.uint8)  # the slab: [rows, row_nbytes]
        self.work = backend.zeros((max(work_nbytes, 1),), np.uint8)
        self.weight_slab = backend.zeros((max(weight_nbytes, 1),), np.uint8)
        self.views: dict[str, object] = {}
        for name, p in self.placements.items():
            s, dt = p.spec, np.dtype(p.spec.dtype)
            if s.is_state:
                strides = (self.row_nbytes,) + _c_strides(s.shape, dt.itemsize)
                self.views[name] = backend.view(self.state, p.offset, (rows,) + s.shape, dt, strides)
            elif s.role == "weight":
                self.views[name] = backend.view(self.weight_slab, p.offset, s.shape, dt, None)
            else:
                self.views[name] = backend.view(self.work, p.offset, (rows,) + s.shape, dt, None)

    def __getitem__(self, name: str):
        return self.views[name]

    def state_bytes(self, row: int = 0):
        """The contiguous state span of one row: a snapshot is one copy of this."""
        return self.state[row]

    def state_specs(self) -> list[BufferSpec]:
        return [s for s in self.specs if s.is_state]

    def row_view(self, name: str, row_bytes) -> np.ndarray:
        """One state buffer inside a host copy of a state row (export, import, debugging)."""
        p = self.placements[name]
        n = p.spec.nbytes
        return np.asarray(row_bytes)[p.offset:p.offset + n].view(p.spec.dtype).reshape(p.spec.shape)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))
