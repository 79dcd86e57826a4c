"""KvLog: the paged, append-only KV log shared by every row and every capsule (DESIGN.md, "State").

The log of each layer is ``[n_pages, KV_PAGE, d]`` (k and v). A row (live or replan branch) reads
its window through its page table ``kv_pages[P]``: position t lives at
``(kv_pages[(t // KV_PAGE) % P], t % KV_PAGE)``. A KV entry is written once and never changes while
any capsule or row can still see it, so a capsule is its small state plus a copy of the page table,
and a fork or a rollback copies no KV at all.

Pages are reference counted (rows and capsules hold references). ``fill[page]`` is how many slots
have been written: a row appends in place only at the fill (it is then the newest writer of that
page); otherwise it copies the partial page first (copy-on-write, fewer than KV_PAGE entries), so a
capsule's entries are never overwritten. When no page is free, the store evicts its oldest unpinned
capsules until one is.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import CapsuleError
from ..model.kernels import KV_PAGE

NO_PAGE = -1  # host mirror of an unused page-table slot; the device table points it at the sink page


class LogFull(CapsuleError):
    """No KV log page can be freed: everything left is held by pinned capsules or by the rows."""


@dataclass
class PendingCopies:
    """Branch rows' copy-on-write left for outside the session lock (prepare_branch_appends(defer_copies=True)):
    the fresh pages are held here (in no table yet) and the old partial pages stay in the rows' tables, so no
    eviction frees them and, written once, their prefixes cannot change meanwhile."""
    j: int  # the table slot that moves
    slot: int  # entries [0, slot) to copy
    copies: list[tuple[int, int, int]]  # (row, new page, old page)

    def new_pages(self) -> np.ndarray:
        return np.array([c[1] for c in self.copies], np.int64)


class KvLog:
    def __init__(self, backend, arena, n_layers: int, n_pages: int):
        self.backend = backend
        self.k = [arena[f"k_log.{layer}"] for layer in range(n_layers)]  # [n_pages, KV_PAGE, d] each
        self.v = [arena[f"v_log.{layer}"] for layer in range(n_layers)]
        # every layer's k and v as one [2 n_layers, n_pages, KV_PAGE, d] view where they lie evenly spaced in the
        # log slab (they do: equal sizes, page-aligned), so copying the partial pages of B rows is one gather and
        # one scatter, not 2 n_layers B copies (each a launch on a device)
        self.logs = _stacked(backend, arena, [f"{kv}_log.{layer}" for layer in range(n_layers) for kv in "kv"])
        self.n_pages = n_pages  # allocatable pages; the log holds one more, the sink:
        self.sink = n_pages  # where unused table slots point, so rows padded into a CUDA graph batch write harmlessly
        self.device_tables = arena["kv_pages"]  # [rows, P] int64, read by the kernels
        rows, self.P = self.device_tables.shape
        self.tables = np.full((rows, self.P), NO_PAGE, np.int64)  # host mirror, the truth for refcounts
        self.refs = np.zeros(n_pages, np.int32)
        self.fill = np.zeros(n_pages, np.int32)
        # free pages, most recently freed first: a replan's pages come back hot in cache
        self.free: deque[int] = deque(range(n_pages))
        self.evict_one: Callable[[], bool] = lambda: False  # set by the store: frees a capsule, False if none
        self.pending: list[PendingCopies] = []  # taken, not yet in a table: held all the same (pages_obtainable)

    # ---- reference counting ---------------------------------------------------------------
    # Both run after every live step (its capsule; an eviction once the store is full), when the step has just
    # flushed the caches: there a loop over a short table costs a third of the array ops, which win past ~16 pages.
    SHORT_TABLE = 16

    def incref(self, pages: np.ndarray) -> None:
        if len(pages) > self.SHORT_TABLE:
            self.refs[pages[pages >= 0]] += 1  # one table holds a page at most once
            return
        refs = self.refs
        for page in pages.tolist():
            if page >= 0:
                refs[page] += 1

    def decref(self, pages: np.ndarray) -> None:
        if len(pages) > self.SHORT_TABLE:
            held = pages[pages >= 0]
            self.refs[held] -= 1
            self.free.extendleft(int(p) for p in held[self.refs[held] == 0])
            return
        refs = self.refs
        for page in pages.tolist():
            if page >= 0:
                refs[page] -= 1
                if refs[page] == 0:
                    self.free.appendleft(page)

    @property
    def pages_used(self) -> int:
        return self.n_pages - len(self.free)

    def prefault(self) -> None:
        """Touch every page now, so that no step pays for first-touch page faults of fresh memory and
        the process's resident memory does not grow while the log fills."""
        with self.backend.activate():
            for log in self.k + self.v:
                log.fill(0)
        self.backend.sync()

    def alloc(self) -> int:
        while not self.free:
            if not self.evict_one():
                raise LogFull(f"KV log full: all {self.n_pages} pages are held by pinned capsules or by the live "
                              "and replan rows; unpin a capsule or raise capsule_budget_mb")
        page = self.free.popleft()
        self.fill[page] = 0
        return page

    # ---- rows -----------------------------------------------------------------------------
    def _write_device(self, row: int, count: int = 1) -> None:
        """Rows row..row+count-1's device tables from the host mirror: one transfer for all of them."""
        rows = slice(row, row + count)
        self.backend.from_host(self.device_tables[rows], self.device_table(self.tables[rows]))

    def rewrite_device_table(self, row: int) -> None:
        """After the row's small state was overwritten from elsewhere (a resumed record): its kv_pages
        must be this log's again."""
        self._write_device(row)

    def device_table(self, table: np.ndarray) -> np.ndarray:
        return np.where(table >= 0, table, self.sink)

    def set_row(self, row: int, pages: np.ndarray, count: int = 1) -> None:
        """Rows row..row+count-1 now read the window of ``pages`` (a capsule's table): references move,
        nothing is copied."""
        pages = np.asarray(pages, np.int64)
        for r in range(row, row + count):
            old = self.tables[r]
            if len(pages) > self.SHORT_TABLE:  # a rollback moves few slots of a long table: only theirs change refs
                moved = np.flatnonzero(pages != old)
                self.incref(pages[moved])
                self.decref(old[moved])
            else:
                self.incref(pages)
                self.decref(old)
            self.tables[r] = pages
        self._write_device(row, count)

    def clear_row(self, row: int, count: int = 1) -> None:
        self.set_row(row, np.full(self.P, NO_PAGE, np.int64), count)

    def prepare_append(self, row: int, pos: int, extend_shared: bool = True) -> None:
        """Before the step that writes position ``pos`` in ``row``: make its page writable by this row.

        ``extend_shared``: the row may append in place to a page others also hold, when it is the newest
        writer of that page. The live row does; replan branches don't (they copy the partial page once),
        so a what-if never pushes the live row into a copy of its own page."""
        if not self._append_in_place(row, pos, extend_shared):  # the live step's usual case: no page work
            self._prepare_rows(row, 1, pos, extend_shared)

    def prepare_branch_appends(self, first: int, count: int, pos: int,
                               defer_copies: bool = False) -> PendingCopies | None:
        """prepare_append(row, pos, extend_shared=False) for rows first..first+count-1 (a replan's branches,
        which step in lockstep): one check for all of them where each appends in place to its own page.
        ``defer_copies``: the partial pages' copy-on-write is returned, to be done by copy_pending outside the
        session lock (only these rows read their tables) and closed by finish_pending under it."""
        if self.branch_appends_in_place(first, count, pos):
            return None
        return self._prepare_rows(first, count, pos, extend_shared=False, defer_copies=defer_copies)

    def branch_appends_in_place(self, first: int, count: int, pos: int) -> bool:
        """The common case of prepare_branch_appends: each of the rows appends in place to a page that only it
        holds (refs 1). Then it touches nothing but those rows' own pages, so a replan that owns the rows may
        call it without the session lock; False (nothing changed): the rows need prepare_branch_appends under it.
        Another thread can only lower such a page's refs (an eviction of a capsule that shared it): 1 read is 1."""
        j, slot = (pos // KV_PAGE) % self.P, pos % KV_PAGE
        pages = self.tables[first:first + count, j]
        if not slot or not (pages >= 0).all():
            return False
        if not ((self.fill[pages] == slot) & (self.refs[pages] == 1)).all():  # each its own page: distinct
            return False
        self.fill[pages] = slot + 1
        return True

    def copy_pending(self, pending: PendingCopies) -> None:
        """The deferred copy-on-write; needs no lock (see PendingCopies)."""
        self._copy_prefixes(pending.new_pages(), np.array([c[2] for c in pending.copies], np.int64), pending.slot)

    def finish_pending(self, pending: PendingCopies, copied: bool) -> None:
        """Under the session lock, after copy_pending: the rows move to their copies and give the old pages
        back. ``copied`` False (the copy failed): the fresh pages go back instead and the rows stay."""
        self.pending.remove(pending)
        if not copied:
            self.decref(pending.new_pages())
            return
        for row, new, _ in pending.copies:
            self._move(row, pending.j, new)
        rows = [c[0] for c in pending.copies]
        self._write_device(min(rows), max(rows) - min(rows) + 1)

    def _prepare_rows(self, first: int, count: int, pos: int, extend_shared: bool,
                      defer_copies: bool = False) -> PendingCopies | None:
        """prepare_append for each row in order; the partial pages of those that move are copied together, and
        the device tables written once. A row that needs no copy (a page boundary) gives its old page back at
        once, as a row at a time did, so the next row may reuse it: a replan needs no more pages than
        check_room reserved. On a failure (LogFull) the pages taken for copies not made go back."""
        j, slot = (pos // KV_PAGE) % self.P, pos % KV_PAGE
        copies, changed = [], []  # (row, new page, old page) to copy; rows whose table changed
        try:
            for row in range(first, first + count):
                if self._append_in_place(row, pos, extend_shared):
                    continue
                page = int(self.tables[row, j])
                new = self.alloc()
                self.fill[new] = slot + 1
                self.refs[new] += 1
                if slot and page >= 0:  # copy-on-write (someone else wrote past slot): the old page stays
                    copies.append((row, new, page))  # referenced until copied, so no eviction frees it
                else:
                    self._move(row, j, new)
                    changed.append(row)
            if copies and defer_copies:
                pending, copies = PendingCopies(j, slot, copies), []
                self.pending.append(pending)
                return pending
            if copies:
                self._copy_prefixes(np.array([c[1] for c in copies]), np.array([c[2] for c in copies]), slot)
        except BaseException:
            for _, new, _ in copies:
                self.decref(np.array([new], np.int64))
            copies = []
            raise
        finally:
            for row, new, _ in copies:
                self._move(row, j, new)
                changed.append(row)
            if changed:
                self._write_device(min(changed), max(changed) - min(changed) + 1)

    def _append_in_place(self, row: int, pos: int, extend_shared: bool) -> bool:
        """When the row is the newest writer of the page at ``pos`` (and, without ``extend_shared``, its only
        holder): take the slot in place and say so."""
        slot = pos % KV_PAGE
        page = int(self.tables[row, (pos // KV_PAGE) % self.P])
        if slot and page >= 0 and self.fill[page] == slot and (extend_shared or self.refs[page] == 1):
            self.fill[page] = slot + 1
            return True
        return False

    def _move(self, row: int, j: int, page: int) -> None:
        """Slot j of the row's table now names ``page`` (whose reference the row already holds)."""
        self.decref(self.tables[row, j:j + 1])
        self.tables[row, j] = page

    def _copy_prefixes(self, new: np.ndarray, old: np.ndarray, n: int, gathered: bool | None = None) -> None:
        """Entries [0, n) of pages ``old`` into pages ``new`` (distinct, fresh), in every layer's k and v: one
        gather and one scatter over the stacked logs on a device (one launch instead of one per page and log),
        a memcpy per page and log in host memory (half the time of the gathered copy's temporary there: 0.23 vs
        0.46 ms for a 4-branch fork, inside the session lock a live step waits on)."""
        if gathered is None:
            gathered = len(new) > 1 and self.logs is not None and self.backend.xp is not np
        if not gathered:
            for a, b in zip(new, old):
                for log in self.k + self.v:
                    self.backend.copy(log[a, :n], log[b, :n])
            return
        xp = self.backend.xp
        with self.backend.activate():  # on the runtime stream, ordered with the steps around it
            new_at, old_at = xp.asarray(new, dtype=np.int64), xp.asarray(old, dtype=np.int64)
            self.logs[:, new_at, :n] = self.logs[:, old_at, :n]

    def privatise_window(self, row: int, pos: int) -> int:
        """Copy every page of the row's window into fresh pages (the whole-row-copy fork, kept as the
        benchmark's baseline). Returns the entries copied."""
        copied = 0
        for j in range(self.P):
            page = int(self.tables[row, j])
            if page < 0:
                continue
            new = self.alloc()
            n = int(self.fill[page])
            for log in self.k + self.v:
                self.backend.copy(log[new, :n], log[page, :n])
            self.fill[new], self.refs[new] = n, 1
            self.decref(self.tables[row, j:j + 1])
            self.tables[row, j] = new
            copied += n
        self._write_device(row)
        return copied

    # ---- windows as arrays (export, import, prefill, the oracle) -------------------------
    def window_positions(self, pos: int, kv_len: int) -> np.ndarray:
        return np.arange(pos - kv_len, pos, dtype=np.int64)

    def window(self, pages: np.ndarray, pos: int, kv_len: int, kv_window: int,
               out: np.ndarray | None = None) -> np.ndarray:
        """Every layer's k and v as one [n_layers, 2, kv_window, d] host array, slot = position % kv_window,
        zero outside the window [pos - kv_len, pos): a whole-window record's KV (tap.py). Written into ``out``
        when given (a float32 array of that shape, C-contiguous)."""
        L, d = len(self.k), self.k[0].shape[2]
        if out is None:
            out = np.empty((L, 2, kv_window, d), np.float32)
        elif out.shape != (L, 2, kv_window, d) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"window: out must be a C-contiguous float32 array of shape {(L, 2, kv_window, d)}, "
                             f"got {out.dtype} {out.shape}")
        if self.backend.xp is not np or self.logs is None:
            out[...] = np.stack([np.stack(pair) for pair in self.gather_positions(pages, pos, kv_len, kv_window)])
            return out
        # host memory: one slice copy of every log per run of positions inside one page and one lap of the
        # ring (~10 runs at the default window) instead of a gather of each position (2.5 ms -> ~0.4 ms; this
        # runs on the step thread, under the session lock, at the first capsule after every rollback)
        flat = out.reshape(2 * L, kv_window, d)  # [L, 2] flattened: the order of self.logs
        if kv_len < kv_window:
            flat[:] = 0
        pages, t = np.asarray(pages), pos - kv_len
        while t < pos:
            n = min(pos, (t // KV_PAGE + 1) * KV_PAGE, (t // kv_window + 1) * kv_window) - t
            page, slot = int(pages[(t // KV_PAGE) % self.P]), t % kv_window
            flat[:, slot:slot + n] = self.logs[:, page, t % KV_PAGE:t % KV_PAGE + n]
            t += n
        return out

    def gather(self, pages: np.ndarray, pos: int, kv_len: int, kv_window: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, (k, v) as [kv_window, d] host arrays, slot = position % kv_window, zero outside the
        window [pos - kv_len, pos)."""
        if self.backend.xp is np and self.logs is not None:
            return [(k, v) for k, v in self.window(pages, pos, kv_len, kv_window)]
        return self.gather_positions(pages, pos, kv_len, kv_window)

    def gather_positions(self, pages: np.ndarray, pos: int, kv_len: int,
                         kv_window: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """gather() one position at a time (a device gather, then one copy to the host per log); the byte
        reference of window()'s runs."""
        t = self.window_positions(pos, kv_len)
        where = np.asarray(pages)[(t // KV_PAGE) % self.P], t % KV_PAGE
        out = []
        for k, v in zip(self.k, self.v):
            d = k.shape[2]
            kk, vv = np.zeros((kv_window, d), np.float32), np.zeros((kv_window, d), np.float32)
            if len(t):
                with self.backend.activate():  # the gather runs on the runtime stream, as to_host reads it
                    kg, vg = k[where], v[where]
                kk[t % kv_window] = self.backend.to_host(kg)
                vv[t % kv_window] = self.backend.to_host(vg)
            out.append((kk, vv))
        return out

    def entries(self, row: int, pos0: int, pos1: int) -> np.ndarray:
        """The row's entries at positions [pos0, pos1) as a host array [n, n_layers, 2, d] (what a
        persisted DELTA record holds)."""
        if pos1 > pos0 and (pos0 // KV_PAGE) == ((pos1 - 1) // KV_PAGE):  # one page (every step): slices
            page, s0 = int(self.tables[row, (pos0 // KV_PAGE) % self.P]), pos0 % KV_PAGE
            sel = (page, slice(s0, s0 + pos1 - pos0))
        else:
            t = np.arange(pos0, pos1, dtype=np.int64)
            sel = (self.tables[row][(t // KV_PAGE) % self.P], t % KV_PAGE)
        logs = [log for pair in zip(self.k, self.v) for log in pair]
        if self.backend.xp is np:  # host memory: one stack copies them (every step's capsule record: keep it lean)
            out = np.stack([log[sel] for log in logs], 1)
        else:
            with self.backend.activate():
                out = np.stack([self.backend.to_host(log[sel]) for log in logs], 1)
        # d spelled out: a zero-entry record (a snapshot right after a step) has nothing to infer -1 from
        return out.reshape(pos1 - pos0, len(self.k), 2, self.k[0].shape[2])

    def write_entry(self, row: int, pos: int, entry: np.ndarray) -> None:
        """Write one position's entries ([n_layers, 2, d]) where the row's table puts it (after prepare_append)."""
        page, slot = int(self.tables[row, (pos // KV_PAGE) % self.P]), pos % KV_PAGE
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            self.backend.from_host(k[page, slot], np.ascontiguousarray(entry[layer, 0]))
            self.backend.from_host(v[page, slot], np.ascontiguousarray(entry[layer, 1]))

    def pages_obtainable(self, keep: list[np.ndarray]) -> int:
        """Pages an allocation can get by evicting every capsule not in ``keep`` (page tables of what
        stays: pinned capsules, the source of a replan): all but those and the rows' own."""
        held = np.concatenate([self.tables.ravel()] + [p.new_pages() for p in self.pending]
                              + [np.asarray(t).ravel() for t in keep])
        return self.n_pages - len(np.unique(held[held >= 0]))

    def load(self, windows: list[tuple[np.ndarray, np.ndarray]], pos: int, kv_len: int) -> np.ndarray:
        """Write a window (as ``gather`` returns it, or in the same slot order) into fresh pages.
        Returns the page table that reads it; the caller owns one reference to each page."""
        t = self.window_positions(pos, kv_len)
        table = np.full(self.P, NO_PAGE, np.int64)
        try:
            for c in np.unique(t // KV_PAGE):
                page = self.alloc()
                self.refs[page] += 1
                table[c % self.P] = page
                ts = t[t // KV_PAGE == c]
                s0, s1 = int(ts[0] % KV_PAGE), int(ts[-1] % KV_PAGE) + 1
                win = ts % (windows[0][0].shape[0])
                for (kw, vw), k, v in zip(windows, self.k, self.v):
                    self.backend.from_host(k[page, s0:s1], np.ascontiguousarray(kw[win]))
                    self.backend.from_host(v[page, s0:s1], np.ascontiguousarray(vw[win]))
                self.fill[page] = s1
        except BaseException:
            self.decref(table)
            raise
        return table


def _stacked(backend, arena, names: list[str]):
    """The named equal-shaped log buffers as one [len(names), *shape] view of the log slab, or None where they
    do not lie evenly spaced in it."""
    first = arena.placements[names[0]]
    offsets = [arena.placements[n].offset for n in names]
    stride = offsets[1] - offsets[0] if len(names) > 1 else first.spec.nbytes
    spec = first.spec
    if any(arena.placements[n].spec.shape != spec.shape for n in names) or stride < spec.nbytes or \
            offsets != [offsets[0] + i * stride for i in range(len(names))]:
        return None
    itemsize = np.dtype(spec.dtype).itemsize
    inner = tuple(int(np.prod(spec.shape[k + 1:], dtype=np.int64)) * itemsize for k in range(len(spec.shape)))
    return backend.view(arena.log_slab, offsets[0], (len(names),) + tuple(spec.shape), np.dtype(spec.dtype),
                        (stride,) + inner)
