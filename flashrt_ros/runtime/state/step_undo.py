"""Undoing a refused step (Session.step): the live row, its page table, references and fills as before.

A step changes the live row's small state (recurrent, conv, mtp, meta, and the device page table) and,
through KvLog.prepare_append, at most one slot of the page table: it appends in place (the page's fill
grows by one) or moves that slot to a fresh page and lets go of the old one. Nothing else allocates
between the two, so both are undone exactly; capsules evicted to make room stay evicted (no live state).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.kernels import KV_PAGE


@dataclass(frozen=True)
class StepUndo:
    slot: int  # the page-table slot the step appends to
    page: int  # its page before the step (-1: none)
    fill: int  # that page's fill before the step

    @classmethod
    def before_step(cls, session) -> StepUndo:
        """Copy the live small row aside (a few KiB, into a buffer allocated once) and note the slot."""
        session.backend.copy(session._undo_row, session.arena.state[0])
        kv = session.kv
        slot = (session.step_count // KV_PAGE) % kv.P
        page = int(kv.tables[0, slot])
        return cls(slot, page, int(kv.fill[page]) if page >= 0 else 0)

    def apply(self, session) -> None:
        kv, page = session.kv, self.page
        new = int(kv.tables[0, self.slot])
        if new != page:  # the step moved to a fresh page and let go of the old one: take it back
            if page >= 0:
                if kv.refs[page] == 0:
                    kv.free.remove(page)
                kv.refs[page] += 1
            kv.tables[0, self.slot] = page
            kv.decref(np.array([new], np.int64))
        elif page >= 0:
            kv.fill[page] = self.fill  # the slot appended in place is free again
        session.backend.copy(session.arena.state[0], session._undo_row)  # the device page table included
        session.backend.sync()
