"""The step thread's side of a capsule record consumer (the disk log in writer.py, the capsule stream in
stream.py): a queue bounded in bytes that never blocks, which record may follow which, and the host
mirror of the last record's window that lets a consumer turn a DELTA into a RESYNC on its own thread.

RecordTap (tap.py) calls has_room / wants_resync / window_buffer / submit / drop / mark_live / mark_reset under
the session lock; a consumer's thread takes the queued tuples ``(queued_at, kind, info, small, kv, n_entries,
nbytes, timeline, spare)``: the session's timeline when the record was queued (a resume may change it before it
goes out), and the whole-window buffer to keep for the next RESYNC once the record is handled (or None).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..state.capsule_store import CapsuleInfo
from .format import EMPTY_KV, EMPTY_SMALL, LIVE, RESET, RESYNC, LogLayout

SPARE_WINDOWS = 2  # whole-window buffers kept for reuse: one being handled, one queued behind it


class RecordQueue:
    def __init__(self, layout: LogLayout, queue_bytes: int, timeline: Callable[[], int] = lambda: 0):
        self.layout, self.timeline = layout, timeline
        self._queue: queue.Queue = queue.Queue()
        self._queue_bytes = 0
        self._queue_cap = int(queue_bytes)
        self._lock = threading.Lock()  # counters shared by the two threads
        # step-thread state: what the last queued record was, so a DELTA can follow it
        self.last_id, self.last_step, self.need_resync = 0, 0, True
        self._dropped = self._written = self._resyncs = self._errors = 0
        self._last_error = ""
        L, d, W = layout.n_layers, layout.d_model, layout.kv_window
        # consumer thread: the last record's window, slot = position % W; touched here (np.zeros maps it lazily), or
        # the first whole-window record faulted it in on the consumer's thread: 64 MiB at kv_window 16384, up to
        # 0.4 s on the test VM, while the records behind it waited (a kill -9 then lost them all)
        self._mirror = np.full((L, 2, W, d), 0.0, np.float32)
        # RESYNC buffers [L, 2, W, d] given back by the consumer, their pages touched here, at set-up: the first
        # write to a fresh 4 MiB block faults ~1,000 pages in, which took up to 20-30 ms on the test VM, on the
        # thread that queues the record (a step, or a committing replan) and under the session lock
        self._spare_windows = [np.full((L, 2, W, d), 0.0, np.float32) for _ in range(SPARE_WINDOWS)]  # written: touched

    # ---- step thread ----------------------------------------------------------------------
    def has_room(self, nbytes: int) -> bool:
        return self._queue_bytes + nbytes <= self._queue_cap

    def wants_resync(self, parent_id: int, step: int) -> bool:
        return (self.need_resync or parent_id != self.last_id or parent_id == 0
                or not 0 <= step - self.last_step <= self.layout.kv_window)

    def drop(self, error: Exception | None = None) -> None:
        """The record could not be queued (no room, or ``error``): the next one must stand alone."""
        with self._lock:
            self._dropped += 1
        if error is not None:
            self.record_error("a record on the step thread", error)
        self.need_resync = True

    def record_error(self, what: str, error: Exception) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = f"{what}: {type(error).__name__}: {error}"

    def window_buffer(self) -> np.ndarray:
        """A [L, 2, W, d] float32 buffer for a RESYNC's KV: a spare one when the consumer has given one back,
        else a new one. Pass it to submit(..., spare=True) so it comes back."""
        with self._lock:
            if self._spare_windows:
                return self._spare_windows.pop()
        L, d, W = self.layout.n_layers, self.layout.d_model, self.layout.kv_window
        return np.empty((L, 2, W, d), np.float32)

    def submit(self, kind: int, info, small: np.ndarray, kv: np.ndarray, n_entries: int,
               spare: bool = False) -> None:
        """Queue a record (host copies the caller does not touch again). Never blocks. ``spare``: kv came from
        window_buffer() and goes back to it once the consumer has handled the record."""
        nbytes = small.nbytes + kv.nbytes
        with self._lock:
            self._queue_bytes += nbytes
        self._queue.put((time.monotonic(), kind, info, small, kv, n_entries, nbytes, self.timeline(),
                         kv if spare else None))
        self.last_id, self.last_step, self.need_resync = info.id, info.step, False

    def mark_live(self, info) -> None:
        """Capsule ``info`` (already recorded) is live now (a rollback): a small marker. The next record
        still resynchronises (its parent is not the last record), so the DELTA chain is untouched."""
        marker = replace(info, parent_id=0, pinned=False, label="")  # the id and the step say it all
        self._queue.put((time.monotonic(), LIVE, marker, EMPTY_SMALL, EMPTY_KV, 0, 0, self.timeline(), None))

    def mark_reset(self, stamp_ns: int = 0) -> None:
        """The live row was reset to zeros (capsules kept): a marker. The next record stands alone (its
        parent is 0)."""
        marker = CapsuleInfo(0, 0, 0, stamp_ns, "", False, 0, "")  # names no capsule
        self._queue.put((time.monotonic(), RESET, marker, EMPTY_SMALL, EMPTY_KV, 0, 0, self.timeline(), None))

    # ---- any thread -----------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the consumer has handled everything queued before this call; False on timeout."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def _stop_consumer(self, timeout_s: float) -> None:
        """The consumer thread (``self._thread``) handles what is queued, then ends."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    # ---- consumer thread ------------------------------------------------------------------
    def _dequeued(self, item) -> None:
        """The consumer is done with ``item`` (its bytes are written or published): a spare buffer goes back."""
        with self._lock:
            self._queue_bytes -= item[6]
            if item[8] is not None and len(self._spare_windows) < SPARE_WINDOWS:
                self._spare_windows.append(item[8])

    def _apply_to_mirror(self, kind: int, step: int, kv: np.ndarray, n: int) -> None:
        W = self.layout.kv_window
        if kind == RESYNC:
            self._mirror[...] = kv
        elif n:
            slots = np.arange(step - n, step) % W
            self._mirror[:, :, slots] = kv.transpose(1, 2, 0, 3)
