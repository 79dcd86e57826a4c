"""Works around CPython's full collection (3.10-3.13), which walks every tracked object while it holds the
GIL: a pause that grows with the capsule store; off: the node's ``gc_freeze_period_s`` 0.

Python's cyclic garbage collector, kept off the step: what survived a collection moves to the permanent
generation (gc.freeze) every ``gc_freeze_period_s``, so the collector never walks the node's long-lived
objects (the capsule index, the observation history, rclpy's entities) again.

Why: a full collection walks every tracked object while it holds the GIL. With the default store full that
is ~200,000 objects and took 45-85 ms in process (more in the node), stopping the step, the stream thread and
the executor together; the replica's lag per 1 s period rose from ~15 ms p99 in the first two minutes to
~40 ms past five, as the store filled. Frozen objects are still freed by reference counting (the capsule
records and history nodes hold no cycles); only a reference cycle that became garbage after it was frozen is
never collected, which is why each freeze first runs a collection of what is not frozen yet, and why cleanup thaws
everything and collects once (a released Session with its stream and persistence taps may hold cycles).
"""
from __future__ import annotations

import gc
import time


def collect_and_freeze() -> float:
    """A collection of the objects not frozen yet (those since the last freeze: small), then freeze the
    survivors. Returns its duration in ms."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return (time.perf_counter() - t0) * 1e3


def thaw() -> None:
    """Unfreeze everything and collect once (a cleanup: the released session's cycles, if any, go now)."""
    gc.unfreeze()
    gc.collect()


class GcFreezer:
    """A timer of ``node`` (its executor thread) that calls collect_and_freeze every ``period_s``; 0 = off."""

    def __init__(self, node, period_s: float):
        self.timer = node.create_timer(period_s, collect_and_freeze) if period_s > 0 else None
