"""The capsule stream: every timeline capsule record (format.py: DELTA, RESYNC, LIVE, RESET) handed to a
``publish`` callback on a thread of its own, as the disk writer takes them (the step thread only queues a
host copy, tap.py). The ROS node publishes them on ``~/capsule_stream``; a replica (ros/group/replica.py) rebuilds
the store from them.

Keyframes: a DELTA goes out as a RESYNC (the whole window, from this thread's host mirror, costing the step
nothing) at least every ``keyframe_s``, so a late subscriber or a bag can start there. A subscriber that
lost records calls ``request_resync()``: the live capsule goes out again at once as a RESYNC (the same id,
which a replica holding it takes as a re-anchor), so it catches up even while the robot stands still.

Each published record carries a sequence number (1, 2, ...): a subscriber that sees one missing has lost a
record, and waits for (or asks for) the next RESYNC.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .format import DELTA, MARKERS, RESYNC, encode_record
from .record_queue import RecordQueue
from .tap import RecordTap, layout_of

MB = 2**20
QUIET_WAIT_S = 0.003  # as the disk writer: publish between steps, not mid-step, when the runtime allows
QUEUE_MIN_MB = 16.0  # the stream queue's default size at small windows
QUEUE_WINDOWS = 3  # whole-window records the default queue holds (a keyframe, a resend and a jump's)
RESEND_MIN_S = 0.5  # whole-window resends on request at most this often (each gathers the window under the lock)


@dataclass(frozen=True)
class StreamRecord:
    seq: int  # 1, 2, ... on this stream: a gap means a lost record
    kind: int  # format.DELTA / RESYNC / LIVE / RESET
    capsule_id: int
    parent_id: int
    step: int
    stamp_ns: int
    blob: bytes  # format.encode_record's bytes: checksummed header, info, small state, KV
    timeline: int  # Session.timeline: whose capsule ids these are (a replica re-syncs when it changes)


@dataclass(frozen=True)
class StreamStats:
    records_published: int
    keyframes_published: int  # RESYNC records (keyframes, requests and jumps)
    records_dropped: int  # queue full, or publish failed: the stream resynchronises after each
    errors: int
    last_error: str
    queue_records: int
    lag_ms: float  # age of the oldest record still queued (0 when none)
    seq: int  # the last sequence number published


def queue_mb_for(layout) -> float:
    """The stream queue's default size: QUEUE_MIN_MB, raised to hold QUEUE_WINDOWS whole-window records."""
    whole_window = 4 * layout.entry_floats * layout.kv_window + layout.row_nbytes
    return max(QUEUE_MIN_MB, math.ceil(QUEUE_WINDOWS * whole_window / MB))


class StreamQueue(RecordQueue):
    def __init__(self, layout, publish: Callable[[StreamRecord], None], keyframe_s: float, queue_mb: float | None,
                 timeline: Callable[[], int], quiet=None, clock: Callable[[object], float] | None = None):
        """``timeline()``: the session's timeline, read as a record is queued. ``clock(info)``: the time of a capsule
        record in seconds, for keyframes; default time.monotonic() when it is published (a replay passes the
        record's own stamp: keyframes by bag time)."""
        if not 0 < keyframe_s < math.inf:
            raise ValueError(f"stream_keyframe_s: must be > 0 and finite, got {keyframe_s!r}")
        whole_window = 4 * layout.entry_floats * layout.kv_window + layout.row_nbytes
        if queue_mb is None:  # sized from the window: every kv_window activates (64 MiB records at 16384)
            queue_mb = queue_mb_for(layout)
        if queue_mb * MB < 2 * whole_window:
            raise ValueError(f"stream queue_mb: {queue_mb:g} cannot hold two whole-window records of "
                             f"{whole_window / MB:.2f} MiB (kv_window {layout.kv_window}); leave it unset "
                             f"to size it from the window")
        super().__init__(layout, int(queue_mb * MB), timeline)
        self.publish, self.keyframe_s, self.quiet = publish, keyframe_s, quiet
        self.clock = clock or (lambda info: time.monotonic())
        # stream-thread state
        self._seq = 0
        self._resync_next = True
        self._requested = False  # a subscriber asked for a keyframe (request_keyframe)
        self._last_keyframe = -math.inf
        self._last_keyframe_at = -math.inf  # time.monotonic() of the last RESYNC published
        self._taken: tuple | None = None  # the item being published (its age counts in lag_ms)
        self._thread = threading.Thread(target=self._run, name="flashrt-stream", daemon=True)
        self._thread.start()

    def request_keyframe(self) -> None:
        """A subscriber asked for a keyframe: the next capsule record at least RESEND_MIN_S after the last
        keyframe goes out as a RESYNC. However often it is asked (a client in a loop, many clients), requests
        add at most one keyframe per RESEND_MIN_S this way: each costs a whole-window record's encode."""
        self._requested = True

    def stats(self) -> StreamStats:
        with self._lock:
            waiting = [w for w in (self._taken, *list(self._queue.queue)[:1]) if isinstance(w, tuple)]
            lag = (time.monotonic() - min(w[0] for w in waiting)) * 1e3 if waiting else 0.0
            return StreamStats(self._written, self._resyncs, self._dropped, self._errors, self._last_error,
                               self._queue.qsize(), lag, self._seq)

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop_consumer(timeout_s)

    # ---- stream thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self.quiet is not None and self.quiet.acquire(timeout=QUIET_WAIT_S):
                self.quiet.release()
            self._taken = item
            try:
                self._publish(*item[1:6], item[7])
            except Exception as e:  # noqa: BLE001 - the stream must outlive any one record
                self._failed(e)
            finally:
                self._taken = None
                self._dequeued(item)

    def _publish(self, kind: int, info, small: np.ndarray, kv: np.ndarray, n: int, timeline: int) -> None:
        if kind not in MARKERS:
            self._apply_to_mirror(kind, info.step, kv, n)
            asked = self._requested and time.monotonic() - self._last_keyframe_at >= RESEND_MIN_S
            due = self._resync_next or asked or self.clock(info) - self._last_keyframe >= self.keyframe_s
            if kind == DELTA and due:
                kind, kv, n = RESYNC, self._mirror, min(info.step, self.layout.kv_window)
        self._send(kind, info, small, kv, n, timeline)

    def _send(self, kind: int, info, small: np.ndarray, kv: np.ndarray, n: int, timeline: int) -> None:
        blob = encode_record(kind, info, small, kv, n)
        self._seq += 1  # taken even when publish fails: a subscriber then sees the gap
        self.publish(StreamRecord(self._seq, kind, info.id, info.parent_id, info.step, info.stamp_ns, blob, timeline))
        if kind in MARKERS:
            return
        if kind == RESYNC:
            self._last_keyframe = self.clock(info)
            self._last_keyframe_at, self._requested = time.monotonic(), False
        self._resync_next = False
        with self._lock:
            self._written += 1
            self._resyncs += kind == RESYNC

    def _failed(self, e: Exception) -> None:
        self._resync_next = True
        with self._lock:
            self._dropped += 1
        self.record_error("publishing", e)


class CapsuleStream(RecordTap):
    """The Session's stream (Session.enable_stream): the tap on its timeline, and the queue's thread."""

    def __init__(self, session, publish: Callable[[StreamRecord], None], keyframe_s: float = 10.0,
                 queue_mb: float | None = None, clock: Callable[[object], float] | None = None):
        super().__init__(session, StreamQueue(layout_of(session), publish, keyframe_s, queue_mb,
                                              lambda: session.timeline, quiet=session.lock, clock=clock))
        self.fingerprint = session.fingerprint
        self._resent_at = -math.inf

    def request_resync(self) -> bool:
        """A subscriber lost records. The live capsule goes out as a RESYNC now (queued behind what is
        waiting), so a replica catches up even while the robot stands still; True when it did. Within
        RESEND_MIN_S of the last such resend (a client asking in a loop), a later record is one, at least
        RESEND_MIN_S after the last keyframe: a flood of requests adds at most two keyframes per RESEND_MIN_S."""
        s, now = self.session, time.monotonic()
        if now - self._resent_at < RESEND_MIN_S:
            self.log.request_keyframe()
            return False
        with s.lock:
            live = s.live_capsule_id
            if not live or live not in s.store:  # reset, or nothing stepped: the next capsule stands alone
                self.log.request_keyframe()
                return False
            self._resent_at = now
            self.resend(s.store.get(live))
            return True

    def resend(self, info) -> None:
        """Under the session lock: capsule ``info`` (held by the store) queued again as a RESYNC."""
        s, log, W = self.session, self.log, self.layout.kv_window
        try:
            if not log.has_room(self.layout.row_nbytes + 4 * self.layout.entry_floats * W):
                log.drop()
                return
            small = s.backend.to_host(s.store.record(info.id))
            log.submit(RESYNC, info, small, self._window(s.store.pages_of(info.id), info.step, log.window_buffer()),
                       min(info.step, W), spare=True)
        except Exception as e:  # noqa: BLE001 - counted; the next record resyncs
            log.drop(e)

    def close(self) -> None:
        self.log.close()


__all__ = ["CapsuleStream", "StreamQueue", "StreamRecord", "StreamStats"]
