"""The Session's side of persistence: pins on disk, capsule ids, and resuming (persist/writer.py writes,
resume.py reads; which record each timeline capsule becomes is tap.py's, shared with the capsule stream).

Capsule ids are reserved ahead of their use in ``ids.frl`` (IdReservation), so a resume never hands out an
id that a client may have seen before the crash.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import FingerprintMismatch
from .format import (
    DELTA,
    IDS_NAME,
    MAX_ID_LIMIT,
    RESYNC,
    TIMELINE_NAME,
    LogCorrupt,
    encode_id_limit,
    encode_timeline,
    iter_segment_paths,
    read_id_limit,
    read_timeline,
    write_durably,
)
from .resume import ResumeReport, meta_reader, read_log, rebuild
from .tap import RecordTap, layout_of
from .writer import CapsuleLog, DirLock, PersistDirInUse, PersistSettings, PersistStats

log = logging.getLogger(__name__)
STALE_KEEP = 3  # stale-* directories kept by move_aside, newest first; older ones are deleted (logged)


class Persistence(RecordTap):
    def __init__(self, session, settings: PersistSettings, dir_lock: DirLock | None = None,
                 moved_aside: Path | None = None):
        super().__init__(session, CapsuleLog(settings, layout_of(session), quiet=session.lock, dir_lock=dir_lock,
                                             is_pinned=session.store.is_pinned))
        self.moved_aside = moved_aside  # where start_fresh put a log this session could not continue
        self.mismatch_moved: Path | None = None  # where a log of another fingerprint went (fresh_on_mismatch)
        try:
            self.ids = IdReservation(self.log.dir, session.store, self.log.record_error)
        except OSError as e:
            self.log.close()
            raise OSError(f"persist_dir {self.log.dir}: cannot record the capsule id reservation {IDS_NAME} "
                          f"({e.strerror or e})") from None
        except BaseException:
            self.log.close()
            raise
        try:  # resume adopted the kept timeline (resume_timeline); a fresh start keeps its own from here
            self.keep_timeline(session.timeline)
        except OSError as e:
            self.close()
            raise OSError(f"persist_dir {self.log.dir}: cannot record the timeline {TIMELINE_NAME} "
                          f"({e.strerror or e})") from None

    def keep_timeline(self, timeline: int) -> None:
        """The session's timeline, kept for a resume (a replica adopts its leader's). Raises OSError."""
        write_durably(self.log.dir, TIMELINE_NAME, encode_timeline(timeline))

    def check_pin_room(self, capsule_id: int) -> None:
        """Under the session lock, before a pin changes anything: PinNotPersistable when its file would not
        fit in the disk budget. ``capsule_id`` 0: a new capsule (a pinned snapshot)."""
        store = self.session.store
        if capsule_id and store.get(capsule_id).pinned:  # an unknown id is refused as such first
            return  # pinned already: its file is counted
        self.log.check_pin_room(len(store.list(pinned_only=True)) + 1)

    def pin_job(self, info) -> Callable[[], None]:
        """Under the session lock: copy the pinned capsule's small state and hold its window's pages. The
        returned job gathers the window and writes the pin file; run it after releasing the lock (a long
        window is copied while steps go on). A capsule whose pin file is on disk already gets none."""
        s = self.session
        if self.log.has_pin_file(info.id):
            return lambda: None  # a capsule never changes: the file written for it still holds
        small = s.backend.to_host(s.store.record(info.id))
        pages = s.store.hold_pages(info.id)  # None: holding would take pages a pin may not; copy now
        window = self._window(s.store.pages_of(info.id), info.step) if pages is None else None

        def job() -> None:
            try:
                win = window if pages is None else self._window(pages, info.step)
                self.log.write_pin(info, small, win, lambda: s.store.is_pinned(info.id))
            finally:
                if pages is not None:
                    with s.lock:
                        s.store.release_pages(pages)
        return job

    def on_unpinned(self, capsule_id: int) -> None:
        self.log.remove_pin(capsule_id, lambda: self.session.store.is_pinned(capsule_id))

    def close(self) -> None:
        self.ids.close()
        self.log.close()


ID_BLOCK = 1 << 16  # ids reserved at a time; the next block is reserved while half of one is left


class IdReservation:
    """New capsule ids only below a limit kept durably in ``persist_dir/ids.frl``, reserved ahead of their
    use as a database sequence cache does: after any crash, new ids start at that limit, above every id a
    client could have seen (what-ifs, a commit's siblings, records the kill lost). The next block is
    written on its own thread while half of the current one is left, so a step waits for the disk only if
    half a block of ids went by before one small file was. A disk that refuses the reservation costs an
    error (persist stats), never a step: ids then go on past the durable limit, and a crash may reuse those."""

    def __init__(self, directory: Path, store, on_error: Callable[[str, Exception], None]):
        self.dir, self.store, self.on_error = Path(directory), store, on_error
        self.block = block = ID_BLOCK
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._landed = 0  # the limit the background write made durable (0: none yet)
        self._closed = False
        store.continue_ids_after(read_id_limit(self.dir) - 1)
        self.limit = store.next_id + block
        self._write(self.limit)  # before any id is handed out; raises: enable fails, nothing handed out
        store.id_watch, store.on_id_watch = self.limit - block // 2, self._on_watch

    def _write(self, limit: int) -> None:
        if limit > MAX_ID_LIMIT:
            raise OSError(f"capsule ids would pass {MAX_ID_LIMIT}: start with a new persist_dir")
        write_durably(self.dir, IDS_NAME, encode_id_limit(limit))

    def _reserve(self, limit: int) -> None:
        try:
            self._write(limit)
            self._landed = limit
        except OSError as e:
            self.on_error("capsule id reservation", e)

    def _on_watch(self, cid: int) -> None:
        """Under the session lock, before id ``cid`` is handed out."""
        try:
            with self._lock:
                if not self._closed:
                    self._advance(cid)
        except Exception as e:  # noqa: BLE001 - never fail the snapshot that asked (a thread that cannot start)
            self.on_error("capsule id reservation", e)

    def _advance(self, cid: int) -> None:
        """Under both locks: the durable limit past ``cid``, and the next block on its way when due."""
        t = self._thread
        if t is not None and (cid >= self.limit or not t.is_alive()):
            t.join()  # past the durable limit, the reservation in flight must land first
            self._thread = None
            self.limit = max(self.limit, self._landed)
        if cid >= self.limit:  # no reservation landed (the disk failed): once more, here
            try:
                self._write(cid + self.block)
                self.limit = cid + self.block
            except OSError as e:
                self.on_error(f"capsule id {cid} handed out past the durable reservation {self.limit} (a "
                              "crash may reuse it)", e)
                self.store.id_watch = cid + self.block // 2  # retry later, not on every id
                return
        if self._thread is None and self.limit - cid <= self.block // 2:
            self._thread = threading.Thread(target=self._reserve, args=(self.limit + self.block,),
                                            name="flashrt-ids", daemon=True)
            self._thread.start()
        self.store.id_watch = self.limit if self._thread is not None else self.limit - self.block // 2

    def close(self) -> None:
        """No more reservations (the directory is about to be released); ids go on unreserved."""
        with self._lock:
            self._closed = True
            self.store.id_watch = float("inf")
            t = self._thread
        if t is not None:
            t.join(30.0)  # as the writer: a disk that hangs does not hang the caller for good


def read_for_resume(session, directory: Path):
    """The log in ``directory`` checked against this session (LogContents). Raises FingerprintMismatch
    for a log another config, weights or plan wrote, LogCorrupt for damage a cut cannot fix."""
    try:
        read_id_limit(directory)  # a damaged reservation refuses here, before the rebuild touches anything
        contents = read_log(directory, layout_of(session), meta_reader(session.arena), keep=session.store.capacity,
                            truncate=True)
        check_log_records(session, contents.records + contents.pins)  # a forged record has a valid crc32
        return contents
    except LogCorrupt as e:
        if e.why.startswith(("fingerprint", "segment layout")):
            raise FingerprintMismatch(f"persist_dir {directory}: {e}") from None
        raise


def resume(session, directory: Path) -> ResumeReport:
    contents = read_for_resume(session, directory)
    was = session.timeline
    resume_timeline(session, directory)  # before the rebuild: the records it queues are of the kept timeline
    try:
        return rebuild(session, contents)
    except BaseException:
        session.timeline = was  # a refused log leaves the session as it was
        raise


def resume_timeline(session, directory: Path) -> None:
    """A resumed session continues the timeline its log was written in (capsule stream subscribers keep what
    they hold). None kept (a log of an older version) or a damaged file: the session's new one, and every
    subscriber re-syncs from scratch, which loses nothing of this node's."""
    try:
        kept = read_timeline(directory)
    except LogCorrupt as e:
        log.warning(f"persist_dir {directory}: {e.why}; the resumed log starts a new timeline (capsule stream "
                    "replicas drop what they held and re-sync)")
        return
    if kept:
        session.timeline = kept


def start_fresh(session, directory: Path) -> Path | None:
    """A fresh start (resume off) next to an old log: the old segments and pin files move aside, so a
    later resume never splices them into this run; new ids continue after the old log's, so an id is
    never reused. Returns where the old log went (None: there was none)."""
    try:
        contents = read_log(Path(directory), layout_of(session), meta_reader(session.arena), keep=0, truncate=False)
    except LogCorrupt:  # another fingerprint, damage: its ids are not known, the reservation still holds
        contents = None
    if contents is not None:
        session.store.continue_ids_after(contents.max_id)
    return move_aside(directory)


def move_aside(directory: Path) -> Path | None:
    """Move every segment and pin file into ``directory/stale-<unix time>/``; None if there was nothing to
    move. The newest STALE_KEEP such directories are kept, older ones deleted (and logged): a node that
    keeps starting on mismatched logs must not fill the disk."""
    directory = Path(directory)
    files = list(iter_segment_paths(directory)) + list(iter_segment_paths(directory, "pin-"))
    if not files:
        return None
    dest = directory / f"stale-{time.time_ns()}"
    dest.mkdir(mode=0o700)
    for f in files:
        shutil.move(str(f), dest / f.name)
    _bound_stale(directory)
    return dest


def _bound_stale(directory: Path) -> None:
    stale = sorted((p for p in directory.glob("stale-*") if p.name[6:].isdigit() and p.is_dir()
                    and not p.is_symlink()), key=lambda p: int(p.name[6:]))
    for old in stale[:-STALE_KEEP]:
        shutil.rmtree(old, ignore_errors=True)
        log.warning(f"persist_dir {directory}: deleted {old.name}, a log moved aside earlier (only the newest "
                    f"{STALE_KEEP} moved-aside logs are kept)")


def check_log_records(session, records) -> None:
    """Every record read for a resume against the session's bounds; LogCorrupt (file, offset, why) for the
    first that breaks them. A forged record has a valid checksum: it is refused, not cut as a torn tail."""
    check = session.record_bounds.check
    for rec in records:
        if rec.kind not in (DELTA, RESYNC):  # markers (LIVE, RESET) carry no state
            continue
        try:
            check(rec.small, rec.kv, rec.kind == RESYNC)
        except ValueError as e:
            raise LogCorrupt(rec.path, rec.offset, f"capsule {rec.id}: {e}") from None


__all__ = ["DirLock", "PersistDirInUse", "Persistence", "PersistSettings", "PersistStats", "ResumeReport",
           "layout_of", "move_aside", "read_for_resume", "resume", "resume_timeline", "start_fresh"]
