"""BufferSpec table -> Arena: the small-state slab, the KV log, a work slab (io + scratch), weights.

The small-state slab is branch-major: ``slab[row]`` holds every small state buffer of one row
(recurrent, conv, mtp, meta and the KV page table) back to back, aligned, so a capsule's own bytes
are one copy of a few KiB. A small state buffer is a strided view ``(rows, *shape)`` with row
stride = ``row_nbytes``. Row 0 is live; rows 1.. are replan branches.

The KV log (role ``kv``) is not per row: every row and every capsule reads it through its page
table (DESIGN.md, "State"). Views never move: a captured graph holds their addresses.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

SMALL_ROLES = ("recurrent", "conv", "mtp", "meta")  # per row, in the small slab: what a snapshot copies
STATE_ROLES = ("kv",) + SMALL_ROLES  # the closed set of state a capsule restores
ROLES = STATE_ROLES + ("io", "scratch", "weight")
WHOLE_ROLES = ("kv", "weight")  # one buffer for all rows (never row-sliced)
ALIGN = 256  # bytes; coalesced loads on the GPU, cache lines on the CPU


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]  # per row (state, io, scratch) or whole (weight)
    dtype: str
    role: str
    bound: float | None = None  # the largest |x| any run can produce (state_bounds refuses a forged state past
                                # it); None: only finiteness is implied

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
        """In the small slab: one copy per row."""
        return self.role in SMALL_ROLES

    @property
    def per_row(self) -> bool:
        return self.role not in WHOLE_ROLES


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Placement:
    spec: BufferSpec
    offset: int  # bytes into the row (state) or into the slab (work, weight)


def layout(specs: list[BufferSpec], rows: int) -> tuple[dict[str, Placement], dict[str, int]]:
    """Offsets for every buffer. Returns (placements, bytes per region): regions are
    ``row`` (small state, per row), ``work`` (io + scratch, all rows), ``weight`` and ``log``."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate buffer names in {names}")
    place, size = {}, {"row": 0, "work": 0, "weight": 0, "log": 0}
    for s in specs:
        region = "row" if s.is_state else "log" if s.role == "kv" else s.role if s.role == "weight" else "work"
        place[s.name] = Placement(s, size[region])
        size[region] += _align(s.nbytes * (rows if region == "work" else 1))
    return place, size


class Arena:
    """All memory of one policy instance, allocated once through a backend."""

    def __init__(self, specs: list[BufferSpec], rows: int, backend):
        self.specs = list(specs)
        self.rows = rows
        self.backend = backend
        self.placements, size = layout(self.specs, rows)
        self.row_nbytes = size["row"]
        self.state = backend.zeros((rows, self.row_nbytes), np.uint8)  # the small slab: [rows, row_nbytes]
        self.work = backend.zeros((max(size["work"], 1),), np.uint8)
        self.weight_slab = backend.zeros((max(size["weight"], 1),), np.uint8)
        self.log_slab = backend.zeros((max(size["log"], 1),), np.uint8)  # the KV log (prefaulted by KvLog)
        self.views: dict[str, object] = {}
        for name, p in self.placements.items():
            s, dt = p.spec, np.dtype(p.spec.dtype)
            if s.is_state:
                strides = (self.row_nbytes,) + _c_strides(s.shape, dt.itemsize)
                self.views[name] = backend.view(self.state, p.offset, (rows,) + s.shape, dt, strides)
            elif s.role == "weight":
                self.views[name] = backend.view(self.weight_slab, p.offset, s.shape, dt, None)
            elif s.role == "kv":
                self.views[name] = backend.view(self.log_slab, p.offset, s.shape, dt, None)
            else:
                self.views[name] = backend.view(self.work, p.offset, (rows,) + s.shape, dt, None)

    def __getitem__(self, name: str):
        return self.views[name]

    def state_bytes(self, row: int = 0):
        """The contiguous small-state span of one row: a snapshot is one copy of this."""
        return self.state[row]

    def state_specs(self) -> list[BufferSpec]:
        """The small-state buffers (one copy per row)."""
        return [s for s in self.specs if s.is_state]

    def row_view(self, name: str, row_bytes) -> np.ndarray:
        """One small-state buffer inside a host copy of a small-state row."""
        p = self.placements[name]
        n = p.spec.nbytes
        return np.asarray(row_bytes)[p.offset:p.offset + n].view(p.spec.dtype).reshape(p.spec.shape)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))
