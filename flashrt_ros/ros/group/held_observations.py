"""The observations a standby holds for a takeover (ROS-free, unit-tested without a ROS graph): those stamped
after the newest record it applied, which the primary stepped, or was about to, after that capsule.

Observations and records come on two topics, so an observation may arrive after the record of its own step.
Such an observation is not held: held, it would stay until the primary's next record, and an idle primary
sends none, so its arrival time would read as the primary's record being overdue since then (a second standby
once took over at once beside the first, the 'record due' clock having started 3.6 s before the kill)."""
from __future__ import annotations

import collections

BUFFER_MAX = 2000  # observations held (20 s at 100 Hz): far more than a lease's worth


class HeldObservations:
    def __init__(self, maxlen: int = BUFFER_MAX):
        self._held: collections.deque = collections.deque(maxlen=maxlen)  # (stamp_ns, arrived_at, message)
        self.overflowed = 0  # observations pushed out of a full buffer (a stalled stream)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, stamp_ns: int, arrived_at: float, msg, recorded_ns: int | None) -> bool:
        """Hold ``msg`` unless the newest record applied (stamp ``recorded_ns``; None: none since the source
        changed) already covers it. An unstamped observation (0: the primary stamps its step with its own
        clock) cannot be matched to a record and is held. Returns whether it was held."""
        if recorded_ns is not None and 0 < stamp_ns <= recorded_ns:
            return False  # its step's record came first
        if len(self._held) == self._held.maxlen:
            self.overflowed += 1
        self._held.append((stamp_ns, arrived_at, msg))
        return True

    def recorded(self, stamp_ns: int) -> None:
        """A record stamped ``stamp_ns`` was applied: what it covers is no longer the primary's to step."""
        while self._held and self._held[0][0] <= stamp_ns:
            self._held.popleft()

    def oldest_arrival(self) -> float | None:
        """When the oldest observation the primary has not recorded arrived (its record is due since then)."""
        return self._held[0][1] if self._held else None

    def after(self, stamp_ns: int) -> list:
        """The messages stamped after ``stamp_ns``, oldest first."""
        return [msg for stamp, _, msg in self._held if stamp > stamp_ns]
