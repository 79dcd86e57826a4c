"""Which record each new timeline capsule becomes, for one consumer (a RecordQueue: the disk log, the
capsule stream). Called by the Session under its lock; never raises (the step already ran).

A capsule whose parent is the consumer's last queued record becomes a DELTA: its small state and the KV
entries of the steps since (one per step). Anything else (the first record, a rollback, a committed replan,
after a drop) becomes a RESYNC with the whole window, gathered on the step thread: a few MiB, once per jump.
Replan branches nobody committed are what-ifs and are not recorded.
"""
from __future__ import annotations

import numpy as np

from .format import DELTA, RESYNC, LogLayout
from .record_queue import RecordQueue


def layout_of(session) -> LogLayout:
    cfg = session.cfg
    return LogLayout(session.fingerprint, session.arena.row_nbytes, cfg.n_layers, cfg.d_model, cfg.kv_window)


class RecordTap:
    def __init__(self, session, log: RecordQueue):
        self.session, self.log, self.layout = session, log, log.layout

    def _window(self, row_pages: np.ndarray, step: int, out: np.ndarray | None = None) -> np.ndarray:
        W = self.layout.kv_window
        return self.session.kv.window(row_pages, step, min(step, W), W, out)  # [n_layers, 2, W, d]

    def on_capsule(self, info) -> None:
        """Right after a timeline capsule of row 0 was taken. The next record resynchronises after a lost one."""
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
            if kind == RESYNC:
                log.submit(kind, info, small, self._window(s.kv.tables[0], info.step, log.window_buffer()), n,
                           spare=True)
            else:
                log.submit(kind, info, small, s.kv.entries(0, log.last_step, info.step), n)
        except Exception as e:  # noqa: BLE001 - counted and visible in stats; the next record resyncs
            log.drop(e)

    def on_live(self, info) -> None:
        """After a rollback made capsule ``info`` live."""
        try:
            self.log.mark_live(info)
        except Exception as e:  # noqa: BLE001 - a lost marker only means a reader picks the newest capsule
            self.log.record_error(f"live marker of capsule {info.id}", e)

    def stats(self):
        return self.log.stats()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the consumer has handled every record queued so far; False on timeout."""
        return self.log.flush(timeout_s)

    def on_reset(self) -> None:
        """After the live row was reset."""
        try:
            self.log.mark_reset()
        except Exception as e:  # noqa: BLE001 - a lost marker only means a reader picks the newest capsule
            self.log.record_error("reset marker", e)
