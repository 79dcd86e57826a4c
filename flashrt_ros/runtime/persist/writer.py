"""CapsuleLog: every timeline capsule appended to segment files in ``persist_dir``, off the step's path.

The step thread only copies the capsule's small state and its new KV entries to the host (~14 KiB at the
default model) and puts them on a queue bounded in bytes. It never blocks: when the queue is full the
record is dropped and counted, and the next record it queues is a RESYNC (the whole window), so the log
never has a hole a resume would read through. A writer thread encodes, writes, fsyncs by the durability
policy, rotates segments and removes the oldest ones past the disk budget.

The writer keeps a host mirror of the last record's window. With it, the writer turns a DELTA into a
RESYNC by itself where it must: at the start of each segment, and after a failed write (a full disk), so
neither costs the step anything. Pin files (``pin-<id>.frl``, one RESYNC each, written crash-safely) keep
pinned capsules; they count in the disk budget, a pin that would not fit is refused up front, and retention
never removes the file of a capsule still pinned.

Sizes are checked against the whole-window record (RESYNC) of the layout: the queue holds at least
QUEUE_MIN_RECORDS of them (a smaller queue could never take one, and the log would write nothing), and a
segment at least SEGMENT_MIN_RECORDS (each segment starts with one: smaller segments would make every
record a whole window, and the writer fall behind).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import StoreFullOfPins
from ..state.private_dir import check_private_dir
from .format import (
    DELTA,
    MARKERS,
    RECORD_HEAD,
    RESYNC,
    LogLayout,
    encode_record,
    iter_segment_paths,
    pin_name,
    record_parts,
    segment_header_bytes,
)
from .record_queue import RecordQueue

log = logging.getLogger(__name__)

MB = 2**20
# Before a batch the writer waits for the runtime to be idle (its lock free), so its Python work (encode,
# checksum) runs between steps instead of taking the GIL from one mid-step. Never longer than this: a
# runtime stepping back to back, or a caller that waits on the writer with the lock held, only delays it.
QUIET_WAIT_S = 0.003
IOV_BATCH = 64  # buffers per os.writev (below every IOV_MAX)
QUEUE_MIN_RECORDS = 3  # whole-window records the queue always has room for (back-to-back rollbacks)
SEGMENT_MIN_RECORDS = 4  # whole-window records a segment holds at least: its opening one costs <= 1/4 of it
NAME_TRIES = 64  # names skipped (taken by something that is not a segment) before a rotation gives up
PARAMS = {"fsync_every_records": "persist_fsync_records", "fsync_every_ms": "persist_fsync_ms",
          "segment_mb": "persist_segment_mb", "budget_mb": "persist_budget_mb", "queue_mb": "persist_queue_mb"}


@dataclass(frozen=True)
class PersistSettings:
    directory: Path
    fsync_every_records: int = 0  # 0 = no record-count trigger
    fsync_every_ms: float = 100.0  # 0 = no time trigger; both 0: the OS writes back when it likes
    segment_mb: float = 64.0  # a segment is closed (and fsynced) past this size
    budget_mb: float = 2048.0  # segments + pin files; the oldest segments go first, pins last
    queue_mb: float = 64.0  # records waiting for the disk; past it, records are dropped and counted

    def __post_init__(self):
        for name, param in PARAMS.items():
            if not 0 <= getattr(self, name) < math.inf:  # inf: a Queue.get timeout too large kills the writer
                raise ValueError(f"{param}: must be >= 0 and finite, got {getattr(self, name)!r}")
        if self.segment_mb <= 0 or self.budget_mb < 2 * self.segment_mb:
            raise ValueError(f"persist_budget_mb: {self.budget_mb:g} must hold at least two segments of "
                             f"persist_segment_mb ({self.segment_mb:g} > 0)")

    def sized_for(self, layout: LogLayout) -> PersistSettings:
        """These settings with the queue and the segment raised to their minimum for ``layout`` (logged);
        ValueError naming persist_budget_mb when the budget cannot hold two such segments."""
        record_mb = whole_window_bytes(layout) / MB
        raised = {}
        for field, n in (("queue_mb", QUEUE_MIN_RECORDS), ("segment_mb", SEGMENT_MIN_RECORDS)):
            need = math.ceil(n * record_mb * 100) / 100
            if getattr(self, field) < need:
                raised[field] = need
                log.warning(f"{PARAMS[field]} {getattr(self, field):g} raised to {need:g}: it must hold {n} "
                            f"whole-window records ({record_mb:.2f} MiB each at kv_window {layout.kv_window})")
        if self.budget_mb < 2 * raised.get("segment_mb", self.segment_mb):
            raise ValueError(f"persist_budget_mb: {self.budget_mb:g} must hold at least two segments of "
                             f"{raised.get('segment_mb', self.segment_mb):g} MB (a segment holds at least "
                             f"{SEGMENT_MIN_RECORDS} whole-window records of {record_mb:.2f} MiB at kv_window "
                             f"{layout.kv_window}); raise persist_budget_mb or lower kv_window")
        return replace(self, **raised) if raised else self


def whole_window_bytes(layout: LogLayout) -> int:
    """The largest record: a RESYNC with the longest label (a pin file is this plus a segment header)."""
    return RECORD_HEAD.size + layout.max_payload()


@dataclass(frozen=True)
class PersistStats:
    records_written: int
    records_dropped: int  # queue full or write failed: the log resynchronises after each
    resyncs_written: int
    write_errors: int
    last_error: str
    queue_records: int
    queue_bytes: int
    lag_ms: float  # age of the oldest record still queued (0 when none)
    fsync_ms_last: float
    fsync_ms_max: float
    log_bytes: int  # segments and pin files on disk
    segments: int
    pins: int


class PersistDirInUse(OSError):
    """Another writer (this process or another) holds the persist_dir."""


class PersistDirUnsafe(OSError):
    """The persist_dir is not a directory, or another user could write into it (private_dir.py)."""


class PinNotPersistable(StoreFullOfPins):
    """A pin refused before anything changed: its file would not fit in persist_budget_mb."""


def check_persist_dir(directory: Path) -> Path:
    """Create (mode 0700) or check the persist_dir by capsule_dir's rules: a log someone else can write
    to could be forged, and one someone else can read leaks the robot's state."""
    return check_private_dir(Path(os.path.realpath(Path(directory).expanduser())), "persist_dir", True,
                             PersistDirUnsafe)


class DirLock:
    """An exclusive flock on the persist_dir itself for one writer's whole life, taken before a resume reads
    (and cuts) the log: a second session would truncate the segment the first is writing as a torn tail,
    and interleave its segments with the first's. The kernel drops it when the process dies."""

    def __init__(self, directory: Path):
        check_persist_dir(directory)
        self._fd: int | None = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            self._fd = None
            raise PersistDirInUse(f"persist_dir {directory}: in use by another capsule log writer (this "
                                  "process or another holds its lock); give each node its own persist_dir") from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


class CapsuleLog(RecordQueue):
    def __init__(self, settings: PersistSettings, layout: LogLayout, quiet=None, dir_lock: DirLock | None = None,
                 is_pinned: Callable[[int], bool] = lambda cid: False):
        """``quiet``: a lock the runtime holds while it steps (the session lock), or None. ``dir_lock``: the
        directory's DirLock, taken by the caller before it read the log (taken here when None); released
        by close(). ``is_pinned(id)``: whether a capsule is pinned now (safe without the session lock):
        retention never removes such a capsule's pin file."""
        settings = settings.sized_for(layout)
        super().__init__(layout, int(settings.queue_mb * MB))
        self.settings, self.quiet, self.is_pinned = settings, quiet, is_pinned
        self.dir = Path(settings.directory)
        self._dir_lock = dir_lock or DirLock(self.dir)
        self._pin_lock = threading.Lock()  # a pin file's name against an unpin's removal (never nests the session lock)
        self._fsync_last = self._fsync_max = 0.0
        # writer-thread state
        self._resync_next = True
        self._fd: int | None = None
        self._seg_path: Path | None = None
        self._seg_bytes = self._good_bytes = 0
        self._unsynced, self._last_sync = 0, time.monotonic()
        self._batch: list = []  # records taken off the queue, not written yet
        self._sizes = {p: p.stat().st_size for p in iter_segment_paths(self.dir)}
        self._pins = {p: p.stat().st_size for p in iter_segment_paths(self.dir, "pin-")}
        self._next_seg = 1 + max((int(p.stem[4:]) for p in self._sizes if p.stem[4:].isdigit()), default=0)
        # the time trigger's fsyncs run on a thread of their own, on a duplicate of the segment's descriptor: the
        # writer goes on writing meanwhile (a kill -9 loses what is not written yet, never what is not fsynced)
        self._syncs: queue.Queue = queue.Queue()
        self._sync_idle = threading.Event()
        self._sync_idle.set()
        self._syncer = threading.Thread(target=self._sync_run, name="flashrt-persist-fsync", daemon=True)
        self._syncer.start()
        self._thread = threading.Thread(target=self._run, name="flashrt-persist", daemon=True)
        self._thread.start()

    # ---- pins (a service thread) ----------------------------------------------------------
    @property
    def pin_file_bytes(self) -> int:
        """The most one pin file takes (a segment header and a whole-window record)."""
        return len(segment_header_bytes(self.layout)) + whole_window_bytes(self.layout)

    def check_pin_room(self, pinned_after: int) -> None:
        """Refuse (PinNotPersistable) a pin that would leave ``pinned_after`` pin files: they must fit in the
        disk budget beside two segments, because retention never removes a pinned capsule's file."""
        s = self.settings
        room = s.budget_mb * MB - 2 * s.segment_mb * MB
        if pinned_after * self.pin_file_bytes > room:
            fits = max(0, int(room // self.pin_file_bytes))
            raise PinNotPersistable(
                f"pin refused: persist_budget_mb {s.budget_mb:g} keeps {fits} pin files of "
                f"{self.pin_file_bytes / MB:.2f} MiB beside two log segments of {s.segment_mb:g} MB, and "
                f"{pinned_after} would be needed; unpin a capsule or raise persist_budget_mb")

    def has_pin_file(self, capsule_id: int) -> bool:
        with self._lock:
            return self.dir / pin_name(capsule_id) in self._pins

    def write_pin(self, info, small: np.ndarray, window: np.ndarray, still_pinned: Callable[[], bool]) -> None:
        """One RESYNC record in its own file, crash-safely: a kill leaves the old file or the new one.
        ``still_pinned`` is asked under the pin lock right before the file takes its name: an unpin or a
        drop that came while it was written wins (remove_pin asks the same under the same lock)."""
        path = self.dir / pin_name(info.id)
        blob = segment_header_bytes(self.layout) + encode_record(
            RESYNC, replace(info, pinned=True), small, window, min(info.step, self.layout.kv_window))
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")  # pins of one capsule may race
        try:
            # never through a link, never blocked on a FIFO planted at the name (it fails, and is counted)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            try:
                os.set_blocking(fd, True)
                _write_all(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._pin_lock:
                if not still_pinned():
                    tmp.unlink()
                    return
                os.replace(tmp, path)
                with self._lock:
                    self._pins[path] = len(blob)
            _fsync_dir(self.dir)
        except OSError as e:  # the pin holds in memory already: a disk error is counted, never raised at the caller
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.record_error(f"pin file of capsule {info.id}", e)

    def remove_pin(self, capsule_id: int, still_pinned: Callable[[], bool]) -> None:
        path = self.dir / pin_name(capsule_id)
        with self._pin_lock:
            if still_pinned():  # pinned again since: that pin's file stays
                return
            path.unlink(missing_ok=True)
            with self._lock:
                self._pins.pop(path, None)

    # ---- status ---------------------------------------------------------------------------
    def stats(self) -> PersistStats:
        with self._lock:
            waiting = [*self._batch[:1], *list(self._queue.queue)[:1]]  # racy peeks: at worst a bit stale
            times = [w[0] for w in waiting if isinstance(w, tuple)]
            lag = (time.monotonic() - min(times)) * 1e3 if times else 0.0
            return PersistStats(self._written, self._dropped, self._resyncs, self._errors, self._last_error,
                                self._queue.qsize() + len(self._batch), self._queue_bytes, lag,
                                self._fsync_last, self._fsync_max,
                                sum(self._sizes.values()) + sum(self._pins.values()), len(self._sizes),
                                len(self._pins))

    def close(self, timeout_s: float = 30.0) -> None:
        self._stop_consumer(timeout_s)
        if not self._thread.is_alive():
            self._syncs.put(None)
            self._syncer.join(timeout_s)
        if not self._thread.is_alive():  # a writer still running keeps the directory
            self._dir_lock.release()

    # ---- writer thread --------------------------------------------------------------------
    def _run(self) -> None:
        # the idle wake-up: at most a minute (a timeout past threading.TIMEOUT_MAX would kill this thread;
        # waking early is harmless, _maybe_fsync checks the time itself)
        period = min(self.settings.fsync_every_ms / 1e3, 60.0) if self.settings.fsync_every_ms else None
        batch = self._batch  # taken after one wait for a quiet runtime: a busy runtime never starves the writer
        while True:
            if batch:
                item = batch.pop(0)
            else:
                try:
                    item = self._queue.get(timeout=period)
                except queue.Empty:  # idle: the time trigger still fires
                    self._maybe_fsync(idle=True)
                    continue
                if self.quiet is not None and self.quiet.acquire(timeout=QUIET_WAIT_S):
                    self.quiet.release()
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            if item is None:
                self._sync_and_close()
                return
            if isinstance(item, threading.Event):
                self._maybe_fsync(force=True)
                item.set()
                continue
            try:
                self._write(*item[1:6])
            except Exception as e:  # noqa: BLE001 - the writer must outlive any one record
                self._failed(e)
            finally:
                self._dequeued(item)
            self._maybe_fsync()

    def _write(self, kind: int, info, small: np.ndarray, kv: np.ndarray, n: int) -> None:
        marker = kind in MARKERS
        if not marker:
            self._apply_to_mirror(kind, info.step, kv, n)
        # a marker opens a segment only when none is open (right after a resume: it names a resumed
        # capsule); a segment's first capsule record is a RESYNC all the same (_rotate sets _resync_next)
        if self._fd is None or (not marker and self._seg_bytes >= self.settings.segment_mb * MB):
            self._rotate()
        if kind == DELTA and self._resync_next:
            kind, kv, n = RESYNC, self._mirror, min(info.step, self.layout.kv_window)
        parts = record_parts(kind, info, small, kv, n)  # no joined copy: written as they are
        size = sum(len(memoryview(part).cast("B")) for part in parts)
        try:
            _write_all(self._fd, parts)
        except OSError:
            os.ftruncate(self._fd, self._good_bytes)  # no torn record in the middle of a segment
            # and the next record goes right after the last good one: a short write moved the offset
            # past it, and writing there would leave a zero-filled hole that ends every later scan
            os.lseek(self._fd, self._good_bytes, os.SEEK_SET)
            self._seg_bytes = self._good_bytes
            raise
        self._seg_bytes = self._good_bytes = self._seg_bytes + size
        self._unsynced += 1  # a marker too: fsynced by the same policy as the records
        if marker:
            return  # not a capsule: counts, the resync flag and the mirror stay as they were
        self._resync_next = False
        with self._lock:
            self._written += 1
            self._resyncs += kind == RESYNC
            self._sizes[self._seg_path] = self._seg_bytes

    def _failed(self, e: Exception) -> None:
        self._resync_next = True
        with self._lock:
            self._dropped += 1
        self.record_error("writing", e)

    def _open_next_segment(self) -> tuple[int, Path]:
        """A new file at the next free segment name. A name taken by anything (a FIFO, a directory, a link,
        an old file) is skipped and counted, never opened: O_EXCL creates or fails, so a FIFO never blocks
        the writer, and a later name serves."""
        for _ in range(NAME_TRIES):
            path = self.dir / f"seg-{self._next_seg:08d}.frl"
            self._next_seg += 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            except FileExistsError as e:
                self.record_error(f"segment name {path.name} is taken by something else: skipped", e)
                continue
            os.set_blocking(fd, True)  # a regular file we just created: writes complete
            return fd, path
        raise OSError(errno.EEXIST, f"{NAME_TRIES} segment names in a row are taken in {self.dir}")

    def _rotate(self) -> None:
        self._sync_and_close()
        fd, path = self._open_next_segment()
        head = segment_header_bytes(self.layout)
        try:
            _write_all(fd, head)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._seg_path = fd, path
        self._seg_bytes = self._good_bytes = len(head)
        self._resync_next = True  # every segment starts with a record that stands alone
        with self._lock:
            self._sizes[path] = len(head)
        _fsync_dir(self.dir)
        self._retain()

    def _retain(self) -> None:
        """Oldest segments first, then the oldest pin files of capsules no longer pinned (a former run's);
        never the open segment, never a pinned capsule's file (check_pin_room keeps those within the
        budget). Under the pin lock: a pin file being renamed into place is never counted and then
        deleted underneath it."""
        budget = self.settings.budget_mb * MB
        with self._pin_lock:
            with self._lock:
                victims = []
                total = sum(self._sizes.values()) + sum(self._pins.values())
                for path in sorted(self._sizes):
                    if total <= budget or path == self._seg_path:
                        break
                    total -= self._sizes.pop(path)
                    victims.append(path)
                for path in sorted(self._pins):
                    if total <= budget:
                        break
                    if not self._pin_is_live(path):
                        total -= self._pins.pop(path)
                        victims.append(path)
            for path in victims:
                path.unlink(missing_ok=True)

    def _pin_is_live(self, path: Path) -> bool:
        digits = path.stem[4:]
        return not digits.isdigit() or self.is_pinned(int(digits))  # a name that is no id: keep, never guess

    def _maybe_fsync(self, idle: bool = False, force: bool = False) -> None:
        """``force`` (a flush, a rotation, the close): fsync here, after the one in flight. Otherwise a due fsync
        goes to the fsync thread, unless one is still running there (the next check hands on the next)."""
        s = self.settings
        if self._fd is None or not self._unsynced:
            return
        due = force or (s.fsync_every_records and self._unsynced >= s.fsync_every_records) or (
            s.fsync_every_ms and (time.monotonic() - self._last_sync) * 1e3 >= s.fsync_every_ms)
        if not due:
            return
        if not force:
            if not self._sync_idle.is_set():
                return
            self._sync_idle.clear()
            self._syncs.put(os.dup(self._fd))  # the fsync thread closes it
            self._unsynced, self._last_sync = 0, time.monotonic()
            return
        self._sync_idle.wait()
        try:
            self._fsync(self._fd)
        except OSError as e:
            self._failed(e)
            return
        self._unsynced, self._last_sync = 0, time.monotonic()

    def _fsync(self, fd: int) -> None:
        t0 = time.perf_counter()
        os.fsync(fd)
        ms = (time.perf_counter() - t0) * 1e3
        with self._lock:
            self._fsync_last, self._fsync_max = ms, max(self._fsync_max, ms)

    def _sync_run(self) -> None:
        while True:
            fd = self._syncs.get()
            if fd is None:
                return
            try:
                self._fsync(fd)
            except OSError as e:  # counted as the writer's own failures are: the next record resyncs
                self._failed(e)
            finally:
                os.close(fd)
                self._sync_idle.set()

    def _sync_and_close(self) -> None:
        if self._fd is None:
            return
        self._maybe_fsync(force=True)
        os.close(self._fd)
        self._fd = None


def _write_all(fd: int, blob: bytes | list) -> None:
    """``blob``: bytes, or a list of buffers written in order with os.writev (none joined first)."""
    views = [memoryview(part).cast("B") for part in (blob if isinstance(blob, list) else [blob])]
    views = [v for v in views if v.nbytes]
    while views:
        done = os.writev(fd, views[:IOV_BATCH])
        while views and done >= views[0].nbytes:
            done -= views.pop(0).nbytes
        if done:
            views[0] = views[0][done:]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
