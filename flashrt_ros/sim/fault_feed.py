"""The sim node's faulty sensor and the wire format of its late corrections (no rclpy: std_msgs types only).

With faults on, flashrt-sim publishes on `observation` what sim/faults.py's FaultySensor reports for the episode's
seeded faults, and at the start of the period a fault's correction arrives in (SensorFault.arrival, before that
period's reading goes out) it publishes on `observation_corrected` one std_msgs/Float64MultiArray: a row per
reading from the fault's first bad one to the newest (fault.start .. arrival - 1, the block a rollback correction
re-steps), each row [sim stamp in ns, the 21 true float32 values as float64 (exact)]. layout.dim[0].label names
the fault: "<kind> <bad readings>" (the first rows are the bad ones, the rest were read clean).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, MultiArrayLayout

from .faults import FaultConfig, FaultySensor, SensorFault, draw_faults

CORRECTION_TOPIC = "observation_corrected"
ROW_LABEL = "stamp_ns,observation"


@dataclass(frozen=True)
class Correction:
    kind: str
    bad_readings: int  # the first rows: the readings the fault spoiled
    stamps_ns: np.ndarray  # [rows] int64: the sim stamps of the readings corrected
    observations: np.ndarray  # [rows, obs_dim] float32: the true readings


def correction_message(fault: SensorFault, stamps_ns, observations) -> Float64MultiArray:
    obs = np.asarray(observations, np.float32)
    rows = np.column_stack([np.asarray(stamps_ns, np.float64), obs.astype(np.float64)])
    width = rows.shape[1]
    layout = MultiArrayLayout(dim=[
        MultiArrayDimension(label=f"{fault.kind} {fault.end - fault.start + 1}", size=len(rows),
                            stride=len(rows) * width),
        MultiArrayDimension(label=ROW_LABEL, size=width, stride=width)])
    return Float64MultiArray(layout=layout, data=rows.ravel().tolist())


def parse_correction(msg: Float64MultiArray) -> Correction:
    """ValueError for a message that is not a correction."""
    dims = list(msg.layout.dim)
    if len(dims) != 2 or dims[1].label != ROW_LABEL:
        raise ValueError("not an observation correction (layout)")
    kind, bad = dims[0].label.split(" ")
    rows = np.asarray(msg.data, np.float64).reshape(dims[0].size, dims[1].size)
    # stamps up to 2^53 ns (104 days of sim time) are exact in float64; the float32 values round-trip exactly
    return Correction(kind, int(bad), rows[:, 0].astype(np.int64), rows[:, 1:].astype(np.float32))


class FaultFeed:
    """One episode's faulty readings and their corrections: read(stamp, true_obs) once per published reading."""

    HISTORY = 400  # readings kept for a correction: more than the longest fault plus its delay (30 + 20)

    def __init__(self, config: FaultConfig | None = None):
        self.config = config or FaultConfig()
        self.faults: list[SensorFault] = []

    def start(self, seed: int, steps: int) -> None:
        """A new episode of `steps` control steps: its seeded faults (as the offline evaluation draws them)."""
        self.faults = draw_faults(seed, steps, self.config)
        self._sensor = FaultySensor(self.faults, self.config)
        self._arrivals = {f.arrival: f for f in self.faults}
        self._true: dict[int, tuple[int, np.ndarray]] = {}
        self.reading = 0

    def read(self, stamp_ns: int, true_obs) -> tuple[np.ndarray, Float64MultiArray | None]:
        """(what the sensor reports for this reading, the correction to publish before it or None)."""
        self.reading += 1
        n = self.reading
        correction = None
        fault = self._arrivals.get(n)
        if fault is not None:
            stamps, rows = zip(*(self._true[k] for k in range(fault.start, n)))
            correction = correction_message(fault, stamps, rows)
        self._true[n] = (int(stamp_ns), np.array(true_obs, np.float32))
        self._true.pop(n - self.HISTORY, None)
        return self._sensor.read(n, true_obs), correction
