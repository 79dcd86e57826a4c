"""World capsules: the simulated world's full physics state (mj_getState bytes), kept by sim time beside the
policy's capsules, so a planner can fork the robot and its world together: the policy capsule of an observation
carries that observation's stamp, and the world capsule of the same stamp is the world it saw.

A ring of the newest `capacity` states (a state is a few hundred bytes: a minute at 100 Hz is about 2.5 MB).
"""
from __future__ import annotations

import bisect
from collections import deque

from .world import PusherWorld


class WorldCapsules:
    def __init__(self, capacity: int = 6000):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._stamps: deque[int] = deque()
        self._states: deque[bytes] = deque()

    def __len__(self) -> int:
        return len(self._stamps)

    def take(self, world: PusherWorld) -> int:
        """Keep the world's state under its sim time (ns); the oldest goes when the ring is full."""
        stamp = world.time_ns
        if self._stamps and stamp <= self._stamps[-1]:
            raise ValueError(f"sim time {stamp} ns is not after the newest capsule's {self._stamps[-1]} ns")
        if len(self._stamps) == self.capacity:
            self._stamps.popleft()
            self._states.popleft()
        self._stamps.append(stamp)
        self._states.append(world.state())
        return stamp

    def at(self, stamp_ns: int) -> tuple[int, bytes]:
        """(stamp, state) of the newest capsule at or before stamp_ns: the world as it was at that time."""
        i = bisect.bisect_right(self._stamps, stamp_ns) - 1
        if i < 0:
            oldest = f"the oldest is {self._stamps[0]} ns" if self._stamps else "none is kept"
            raise KeyError(f"no world capsule at or before {stamp_ns} ns ({oldest})")
        return self._stamps[i], self._states[i]

    def restore(self, world: PusherWorld, stamp_ns: int) -> int:
        """Make the capsule at stamp_ns live in world, and drop the newer ones (their future is rewritten)."""
        stamp, state = self.at(stamp_ns)
        world.set_state(state)
        while self._stamps[-1] > stamp:
            self._stamps.pop()
            self._states.pop()
        return stamp

    def fork(self, stamp_ns: int, world: PusherWorld | None = None) -> PusherWorld:
        """A separate world at the capsule's state, for a what-if; the live world and the ring are untouched."""
        _, state = self.at(stamp_ns)
        twin = PusherWorld(world.config if world is not None else None)
        twin.set_state(state)
        return twin
