"""Seeded sensor faults of the Pusher's observation, and the corrected measurement that arrives late.

A fault corrupts a window of readings [start, end] (control steps, 1-based: the n-th observation the policy
steps): the arm's joint readings dropped (the driver repeats the last good message: positions, velocities and
the hand frozen), noisy (encoder noise on the positions), zeroed (a driver reset: positions and velocities
read 0) or the object's estimate stale (its x, y frozen). The correct values of the whole window arrive
`delay` steps after its last reading (30-200 ms at 100 Hz), as one corrected measurement: the planner can act
on it at step end + delay. Faults never overlap, each leaves room for its correction before the next, and the
same seed draws the same faults.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .world import ARM_JOINTS, CONTROL_HZ, OBS_NAMES

_I = {n: i for i, n in enumerate(OBS_NAMES)}
POSITIONS = slice(_I[f"{ARM_JOINTS[0]}.position"], _I[f"{ARM_JOINTS[-1]}.position"] + 1)
VELOCITIES = slice(_I[f"{ARM_JOINTS[0]}.velocity"], _I[f"{ARM_JOINTS[-1]}.velocity"] + 1)
HAND = slice(_I["hand.x"], _I["hand.z"] + 1)
OBJECT = slice(_I["object.x"], _I["object.y"] + 1)
ARM_READING = slice(POSITIONS.start, HAND.stop)  # one joint_states message and the hand derived from it

KINDS = ("dropped", "noisy", "zeroed", "stale_object")


@dataclass(frozen=True)
class FaultConfig:
    joint_steps: tuple[int, int] = (5, 20)  # a burst of bad joint readings, inclusive
    object_steps: tuple[int, int] = (10, 30)  # a stale object estimate
    delay_ms: tuple[int, int] = (30, 200)  # the correct values arrive this late, after the window's last reading
    noise_rad: float = 0.1  # std of a noisy burst's error on each joint position
    gap_steps: tuple[int, int] = (50, 150)  # clean steps from one correction to the next fault
    first_step: int = 30  # no fault before the policy has a capsule history to roll back into


@dataclass(frozen=True)
class SensorFault:
    kind: str
    start: int  # first bad reading (1-based step)
    end: int  # last bad reading
    delay: int  # steps from the last bad reading to its correction
    noise_seed: int

    @property
    def arrival(self) -> int:
        """The step at whose start the correction is in hand: it covers readings start .. arrival - 1."""
        return self.end + self.delay

    def covers(self, step: int) -> bool:
        return self.start <= step <= self.end


def draw_faults(seed: int, steps: int, config: FaultConfig | None = None) -> list[SensorFault]:
    """The faults of an episode of `steps` control steps; the same seed gives the same list."""
    c = config or FaultConfig()
    rng = np.random.default_rng([seed, 0x5E45])  # apart from the world's own stream of this seed
    faults, step = [], c.first_step
    while True:
        kind = KINDS[int(rng.integers(len(KINDS)))]
        lo, hi = c.object_steps if kind == "stale_object" else c.joint_steps
        length = int(rng.integers(lo, hi + 1))
        delay = int(round(rng.uniform(*c.delay_ms) * CONTROL_HZ / 1000))
        fault = SensorFault(kind, step, step + length - 1, max(delay, 1), int(rng.integers(2**31)))
        if fault.arrival > steps:
            return faults
        faults.append(fault)
        step = fault.arrival + int(rng.integers(c.gap_steps[0], c.gap_steps[1] + 1))


class FaultySensor:
    """What the policy reads: the true observation, corrupted inside a fault's window."""

    def __init__(self, faults: list[SensorFault], config: FaultConfig | None = None):
        self.faults = list(faults)
        self.config = config or FaultConfig()
        self._last_good: np.ndarray | None = None

    def fault_at(self, step: int) -> SensorFault | None:
        return next((f for f in self.faults if f.covers(step)), None)

    def read(self, step: int, true_obs: np.ndarray) -> np.ndarray:
        """The observation of this step as the sensor reports it (float32, a copy)."""
        obs = np.array(true_obs, np.float32)
        fault = self.fault_at(step)
        if fault is None:
            self._last_good = obs.copy()
            return obs
        held = self._last_good if self._last_good is not None else obs
        if fault.kind == "dropped":
            obs[ARM_READING] = held[ARM_READING]
        elif fault.kind == "noisy":
            rng = np.random.default_rng([fault.noise_seed, step])
            noise = rng.normal(0.0, self.config.noise_rad, len(ARM_JOINTS))
            obs[POSITIONS] += noise.astype(np.float32)
        elif fault.kind == "zeroed":
            obs[POSITIONS] = 0.0
            obs[VELOCITIES] = 0.0
        else:
            obs[OBJECT] = held[OBJECT]
        return obs
