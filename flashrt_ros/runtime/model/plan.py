"""GraphPlan: an ordered list of kernel ops over named buffers.

Build once, bind to a row range ("capture"), then replay with no allocation. The numpy backend
binds each op to its reference twin over row-sliced views; the CUDA backend launches the same ops
as CUDA C kernels and captures them into a CUDA graph (see backend.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .kernels import REGISTRY, Kernel


@dataclass(frozen=True)
class Op:
    kernel: str
    args: tuple[str, ...]  # buffer names, matching the kernel's params
    consts: tuple[tuple[str, int | float], ...] = ()
    label: str = ""

    @property
    def spec(self) -> Kernel:
        return REGISTRY[self.kernel]

    def const_dict(self) -> dict[str, int | float]:
        return dict(self.consts)


@dataclass
class GraphPlan:
    ops: list[Op] = field(default_factory=list)

    def add(self, kernel: str, *args: str, label: str = "", **consts) -> None:
        if kernel not in REGISTRY:
            raise ValueError(f"unknown kernel {kernel!r}")
        k = REGISTRY[kernel]
        if len(args) != len(k.params):
            raise ValueError(f"{kernel}: expected {len(k.params)} buffers {k.params}, got {args}")
        if set(consts) != set(k.consts):
            raise ValueError(f"{kernel}: expected constants {k.consts}, got {sorted(consts)}")
        for name, v in consts.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ValueError(f"{kernel}: constant {name} must be a number, got {v!r}")
        self.ops.append(Op(kernel, tuple(args), tuple((c, consts[c]) for c in k.consts), label))

    def validate(self, buffer_names) -> None:
        known = set(buffer_names)
        for i, op in enumerate(self.ops):
            missing = [a for a in op.args if a not in known]
            if missing:
                raise ValueError(f"op {i} ({op.kernel}): unknown buffers {missing}")

    def describe(self) -> str:
        rows = [("#", "op", "kernel", "reads", "writes")]
        for i, op in enumerate(self.ops):
            k = op.spec
            reads = [a for p, a in zip(k.params, op.args) if p in k.reads]
            writes = [a for p, a in zip(k.params, op.args) if p in k.writes]
            consts = ", ".join(f"{c}={v}" for c, v in op.consts)
            rows.append((str(i), op.label or op.kernel, op.kernel + (f"({consts})" if consts else ""),
                         " ".join(reads), " ".join(writes)))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


class NumpyReplay:
    """A plan bound to views of rows [start, start + count): a list of ready calls."""

    def __init__(self, plan: GraphPlan, arena, start: int, count: int):
        self.calls = []
        for op in plan.ops:
            views = []
            for a in op.args:
                v = arena[a]
                spec = arena.placements[a].spec
                views.append(v[start:start + count] if spec.per_row else v)
            op.spec.spec.bind(views, op.const_dict(), contiguity=False)  # the twin's checks, once at bind
            self.calls.append((op.spec.ref, tuple(views), op.const_dict()))

    def replay(self) -> None:
        with np.errstate(over="ignore"):  # exp(-x) -> inf in silu / sigmoid is the intended limit
            for fn, views, consts in self.calls:
                fn(*views, **consts)
