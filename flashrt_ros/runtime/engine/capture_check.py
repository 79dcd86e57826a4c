"""Capture discipline on the CPU: a backend that runs the NumPy twins but polices the plan the way a
CUDA graph capture would, so CI catches what only a GPU would otherwise reject or silently freeze:

- an allocation during replay (a graph holds the addresses it saw at capture);
- a host sync / device read (`to_host`, `from_host`, `sync`) during replay;
- a kernel scalar argument that changes between capture and replay (a graph freezes arguments);
- a buffer address that changed between capture and replay.

The launch list recorded at bind time ("capture") is recomputed from the live views after every
replay and compared argument by argument.
"""
from __future__ import annotations

import tracemalloc

import numpy as np

from ..model.plan import NumpyReplay
from .backend import NumpyBackend
from .launch_table import op_launches

ALLOC_LIMIT = 64 * 1024  # bytes of transient Python/NumPy memory a replay may touch (views, not arrays)


class CaptureViolation(RuntimeError):
    pass


def _signature(launch) -> list:
    sig = [launch.function, launch.grid, launch.block]
    for a in launch.args:
        if isinstance(a, np.ndarray):
            sig.append(("ptr", a.__array_interface__["data"][0]))
        else:
            sig.append(("scalar", a.dtype.str, a.tobytes()))
    return sig


class CheckedReplay:
    def __init__(self, backend: CaptureCheckBackend, plan, arena, start: int, count: int):
        self.backend, self.plan, self.arena, self.start, self.count = backend, plan, arena, start, count
        self.inner = NumpyReplay(plan, arena, start, count)
        self.captured = self._signatures()

    def _signatures(self) -> list[list]:
        return [[_signature(la) for la in op_launches(op, self.arena, self.start, self.count)]
                for op in self.plan.ops]

    def replay(self) -> None:
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        self.backend.in_replay = True
        try:
            self.inner.replay()
        finally:
            self.backend.in_replay = False
            _, peak = tracemalloc.get_traced_memory()
            if started:
                tracemalloc.stop()
        if peak - before > ALLOC_LIMIT:
            raise CaptureViolation(f"allocation during replay: {peak - before} bytes (a graph cannot allocate)")
        for i, (cap_op, cur_op) in enumerate(zip(self.captured, self._signatures())):
            if cap_op == cur_op:
                continue
            op = self.plan.ops[i]
            for cap, cur in zip(cap_op, cur_op):
                for j, (a, b) in enumerate(zip(cap[3:], cur[3:])):
                    if a != b:
                        kind = "buffer address changed" if a[0] == "ptr" else "changing scalar argument"
                        raise CaptureViolation(f"op {i} ({op.label or op.kernel}): {kind} at {cap[0]} arg {j} "
                                               "between capture and replay")
            raise CaptureViolation(f"op {i} ({op.label or op.kernel}): launch shape changed since capture")


class CaptureCheckBackend(NumpyBackend):
    name = "numpy+capture-check"
    # It stands in for CUDA (one replay at a time: in_replay and tracemalloc are process-wide), so a replan
    # computes under the session lock here too.
    concurrent_replay = False

    def __init__(self):
        self.in_replay = False

    def _no_host_sync(self, what: str) -> None:
        if self.in_replay:
            raise CaptureViolation(f"host sync during replay ({what}): a CUDA graph capture would fail")

    def to_host(self, arr):
        self._no_host_sync("to_host / .get()")
        return super().to_host(arr)

    def from_host(self, dst, src) -> None:
        self._no_host_sync("from_host / .set()")
        super().from_host(dst, src)

    def sync(self) -> None:
        self._no_host_sync("synchronize")

    def bind(self, plan, arena, start: int, count: int) -> CheckedReplay:
        return CheckedReplay(self, plan, arena, start, count)
