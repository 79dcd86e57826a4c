"""A listener's record of policy_step messages that does not grow the garbage collector's work with the run.

Used by the demo planner and `flashrt-bench ros`: both hear 100 steps a second for minutes. ROS-free (it reads
the message's fields only), so it is tested without a graph."""
from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np


class StepLog:
    """Each policy_step's stamp and step latency in flat arrays (and, given a clock, when it arrived), and the
    last message whole.

    Why not a list of the messages: each is ~5 objects the garbage collector tracks, and a full collection
    walks them all while it holds the GIL, a replan's answer waiting behind it. Kept, they made the demo
    planner's full collections 45 ms at t = 194 s and 360 s of the mission (a round trip in flight took 51 ms,
    13 of it in the node), longer later; the 10-minute soaks' only round trips past 50 ms came then. The arrays
    hold no tracked object, so the collector's work no longer grows with the run."""

    def __init__(self, clock_ns: Callable[[], int] | None = None):
        self._clock_ns = clock_ns  # the listener's clock, on the sensor's time base (None: no receipt times)
        self._received_ns = array("q")  # [steps] int64 ns: when each arrived (empty without a clock)
        self._stamps_ns = array("q")  # [steps] int64 ns: the observation's stamp (the sensor's clock)
        self._latency_ms = array("d")  # [steps] float64: the node's step latency
        self.last = None  # the newest PolicyStep (its capsule id anchors the demo's deep rollback check)

    def add(self, msg) -> None:
        """A subscription callback; the latency array is appended last, so len() counts only whole entries."""
        if self._clock_ns is not None:
            self._received_ns.append(self._clock_ns())
        self._stamps_ns.append(msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec)
        self.last = msg
        self._latency_ms.append(msg.step_latency_ms)

    def __len__(self) -> int:
        return len(self._latency_ms)

    def round_trip_ms(self, i: int) -> float:
        """Step i's observation stamp -> its policy_step's arrival, in ms (needs the clock)."""
        if self._clock_ns is None:
            raise ValueError("StepLog(clock_ns=...) records arrivals; this one was made without a clock")
        return (self._received_ns[i] - self._stamps_ns[i]) / 1e6

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the stamps and latencies, of the same length even if a callback is still adding."""
        n = len(self)
        return (np.array(self._stamps_ns[:n], dtype=np.int64), np.array(self._latency_ms[:n], dtype=np.float64))
