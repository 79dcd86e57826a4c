"""The leader's lease (issue 44.1, docs/leadership.md), renewed from a thread of its own: the proof that this
process ran lately, whatever its executor is doing. A replan's callbacks or a long catch-up delay the executor,
not this thread, so they never lapse the lease (they starved the 100 Hz loop when the executor renewed it).

Every ``renew_s`` the thread publishes a heartbeat; the proof is the monotonic time taken just before that
publish (no standby heard it earlier). A renewal that finds the last proof older than ``lease - margin`` marks
the lease ``lapsed`` before it renews: the process stood still (SIGSTOP, a stalled machine) long enough for a
standby to be taking over, and the leader must check that no newer claim exists before it publishes again,
however fresh the proof is by then. ROS-free: the publish is passed in (unit-tested without a ROS graph).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class HeartbeatLease:
    def __init__(self, heartbeat: Callable[[], None], lease_s: float, margin_s: float, renew_s: float,
                 on_error: Callable[[Exception], None] = lambda e: None):
        self._heartbeat, self._on_error = heartbeat, on_error
        self.window_s = lease_s - margin_s  # a proof older than this proves nothing
        self.renew_s = renew_s
        self._lock = threading.Lock()  # proof and lapsed change together: a reader never sees a fresh proof alone
        self.proof = -math.inf
        self.lapsed = False
        self._seen_stale = -math.inf  # the proof whose staleness take_lapse already reported (one stall, one hold)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, proof: float) -> None:
        """Proven at ``proof`` (a claim's time); renewed from here on until stop()."""
        with self._lock:
            self.proof, self.lapsed = proof, False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flashrt_lease", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            self.renew()

    def renew(self) -> bool:
        """One heartbeat (the lease thread; the executor after a hold). False: not published, no proof."""
        t0 = time.monotonic()
        with self._lock:
            if t0 - self.proof >= self.window_s and self.proof != self._seen_stale:
                self.lapsed = True
        try:
            self._heartbeat()
        except Exception as e:  # noqa: BLE001 - deactivating meanwhile: no proof
            self._on_error(e)
            return False
        with self._lock:
            self.proof = max(self.proof, t0)
        return True

    def current(self) -> bool:
        """Proven within the window, and no stall seen since the last check (take_lapse)."""
        with self._lock:
            return not self.lapsed and time.monotonic() - self.proof < self.window_s

    def take_lapse(self) -> bool:
        """Whether the lease lapsed since it was last asked (the hold that follows clears it)."""
        with self._lock:
            stale = time.monotonic() - self.proof >= self.window_s
            if stale:
                self._seen_stale = self.proof
            lapsed, self.lapsed = self.lapsed or stale, False
            return lapsed

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
