"""A process's own stalls, from the gaps between the ticks of a timer it runs (ROS-free: times are passed in,
so it is unit-tested without a ROS graph). The standby (group/standby.py) does not count time it stood still as
the primary's silence."""
from __future__ import annotations

import collections

STALL_TICK_S = 0.02  # a gap between ticks beyond 2 ticks is time the process stood still


class StallClock:
    """The spans this process stood still, from the gaps between its ticks (ROS-free: times are passed in)."""

    def __init__(self, now: float, tick_s: float = STALL_TICK_S, spans_kept: int = 256):
        self.tick_s = tick_s
        self.last_tick = now
        self.spans: collections.deque = collections.deque(maxlen=spans_kept)  # (from, to) monotonic seconds

    def tick(self, now: float) -> None:
        if now - self.last_tick > 2 * self.tick_s:
            self.spans.append((self.last_tick + 2 * self.tick_s, now))
        self.last_tick = now

    def stalled_s(self, since: float, now: float) -> float:
        """Seconds of [since, now] this process stood still, the gap since its last tick included (a callback
        that runs on resuming, before the ticker has)."""
        spans = [*self.spans, (self.last_tick + 2 * self.tick_s, now)]
        return sum(max(0.0, min(b, now) - max(a, since)) for a, b in spans)
