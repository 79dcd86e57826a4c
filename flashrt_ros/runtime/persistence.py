"""The Session's side of persistence: which record each new timeline capsule becomes, pins on disk, and
resuming (persist.py writes, resume.py reads).

A capsule whose parent is the last queued record becomes a DELTA: its small state and the KV entries of
the steps since (one per step). Anything else (the first record, a rollback, a committed replan, after a
drop) becomes a RESYNC with the whole window, gathered on the step thread: a few MiB, once per jump.
Replan branches nobody committed are what-ifs and are not persisted.
"""
from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import FingerprintMismatch
from .persist import CapsuleLog, DirLock, PersistDirInUse, PersistSettings, PersistStats
from .persist_format import DELTA, RESYNC, LogCorrupt, LogLayout, iter_segment_paths
from .resume import ResumeReport, meta_reader, read_log, rebuild

log = logging.getLogger(__name__)
STALE_KEEP = 3  # stale-* directories kept by move_aside, newest first; older ones are deleted (logged)


def layout_of(session) -> LogLayout:
    cfg = session.cfg
    return LogLayout(session.fingerprint, session.arena.row_nbytes, cfg.n_layers, cfg.d_model, cfg.kv_window)


class Persistence:
    def __init__(self, session, settings: PersistSettings, dir_lock: DirLock | None = None,
                 moved_aside: Path | None = None):
        self.session = session
        self.layout = layout_of(session)
        self.log = CapsuleLog(settings, self.layout, quiet=session.lock, dir_lock=dir_lock,
                              is_pinned=session.store.is_pinned)
        self.moved_aside = moved_aside  # where start_fresh put a log this session could not continue

    def _window(self, row_pages: np.ndarray, step: int) -> np.ndarray:
        W = self.layout.kv_window
        pairs = self.session.kv.gather(row_pages, step, min(step, W), W)
        return np.stack([np.stack(pair) for pair in pairs])  # [n_layers, 2, W, d]

    def on_capsule(self, info) -> None:
        """Called under the session lock right after a timeline capsule of row 0 was taken. Never raises:
        the step already ran, and the log resynchronises after a lost record."""
        s, log, W = self.session, self.log, self.layout.kv_window
        try:
            if log.wants_resync(info.parent_id, info.step):
                kind, n, floats = RESYNC, min(info.step, W), W  # the whole window, zeros outside it
            else:
                kind, n = DELTA, info.step - log.last_step
                floats = n
            if not log.has_room(self.layout.row_nbytes + 4 * self.layout.entry_floats * floats):
                log.drop()
                return
            small = s.backend.to_host(s.arena.state[0])
            kv = self._window(s.kv.tables[0], info.step) if kind == RESYNC else s.kv.entries(0, log.last_step,
                                                                                               info.step)
            log.submit(kind, info, small, kv, n)
        except Exception as e:  # noqa: BLE001 - counted and visible in stats; the next record resyncs
            log.drop(e)

    def on_live(self, info) -> None:
        """Under the session lock, after a rollback made capsule ``info`` live. Never raises."""
        try:
            self.log.mark_live(info)
        except Exception as e:  # noqa: BLE001 - a lost marker only means a resume picks the newest capsule
            self.log.record_error(f"live marker of capsule {info.id}", e)

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

    def stats(self) -> PersistStats:
        return self.log.stats()

    def flush(self, timeout_s: float = 30.0) -> bool:
        return self.log.flush(timeout_s)

    def close(self) -> None:
        self.log.close()


def read_for_resume(session, directory: Path):
    """The log in ``directory`` checked against this session (LogContents). Raises FingerprintMismatch
    for a log another config, weights or plan wrote, LogCorrupt for damage a cut cannot fix."""
    try:
        return read_log(directory, layout_of(session), meta_reader(session.arena), keep=session.store.capacity,
                        truncate=True)
    except LogCorrupt as e:
        if e.why.startswith(("fingerprint", "segment layout")):
            raise FingerprintMismatch(f"persist_dir {directory}: {e}") from None
        raise


def resume(session, directory: Path) -> ResumeReport:
    return rebuild(session, read_for_resume(session, directory))


def start_fresh(session, directory: Path) -> Path | None:
    """A fresh start next to an old log: new ids continue after the log's, so an id is never reused. A log
    this session cannot continue (another fingerprint, damage) is moved aside first; returns where."""
    try:
        contents = read_log(Path(directory), layout_of(session), meta_reader(session.arena), keep=0, truncate=True)
    except LogCorrupt:
        return move_aside(directory)
    session.store.continue_ids_after(contents.max_id)
    return None


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


__all__ = ["DirLock", "PersistDirInUse", "Persistence", "PersistSettings", "PersistStats", "ResumeReport",
           "layout_of", "move_aside", "read_for_resume", "resume", "start_fresh"]
