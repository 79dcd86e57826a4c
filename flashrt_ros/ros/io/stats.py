"""The node's counters and recent step latencies, shared by three threads: the executor (live steps,
/diagnostics), the replan worker (replan results) and the action server's thread
(refused goals). Every change and every read of the latency window goes through one lock, so no
increment is lost and the window is never trimmed under a reader."""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

LATENCY_WINDOW = 1000  # steps kept for the p50 / p99 in /diagnostics
RATE_WINDOW = 200  # steps over which /diagnostics measures the step rate


@dataclass
class NodeStats:
    steps: int = 0
    rejected: int = 0
    joint_name_mismatches: int = 0  # JointStates refused because their names do not fit joint_names
    last_joint_name_error: str = ""
    joint_name_mismatches_reported: int = 0  # mismatches seen by the last /diagnostics
    step_deadline_misses: int = 0
    capsule_errors: int = 0
    replans: int = 0
    replans_rejected: int = 0
    replan_deadline_misses: int = 0
    persist_drops_reported: int = 0  # persist drops seen by the last /diagnostics
    steps_refused: int = 0  # non-finite actions: not published, state kept (Session.step)
    steps_refused_reported: int = 0  # seen by the last /diagnostics
    step_refused_why: str = ""  # the last refusal; "" once a step succeeds again
    stamps_from_clock: int = 0  # observations without a stamp (zero or none): stamped with the node's clock
    stamps_in_future: int = 0  # observations stamped past max_future_stamp_ms ahead: refused (also in rejected)
    latencies_ms: list = field(default_factory=list)
    step_times: deque = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str, n: int = 1) -> None:
        """Add n to the counter `name`, from any thread."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def add_step(self, latency_ms: float, missed_deadline: bool) -> None:
        with self._lock:
            self.steps += 1
            self.step_refused_why = ""
            self.step_deadline_misses += int(missed_deadline)
            self.latencies_ms.append(latency_ms)
            self.step_times.append(time.monotonic())
            if len(self.latencies_ms) > 2 * LATENCY_WINDOW:
                del self.latencies_ms[:-LATENCY_WINDOW]

    def joint_name_mismatch(self, reason: str) -> None:
        with self._lock:
            self.rejected += 1
            self.joint_name_mismatches += 1
            self.last_joint_name_error = reason

    def step_refused(self, reason: str) -> None:
        with self._lock:
            self.steps_refused += 1
            self.step_refused_why = reason

    def recent(self) -> tuple[list, list]:
        """Copies of the latency window and the step times, taken together."""
        with self._lock:
            return list(self.latencies_ms[-LATENCY_WINDOW:]), list(self.step_times)
