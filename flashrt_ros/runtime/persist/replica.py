"""A replica: a Session whose store is rebuilt, record by record, from a primary's capsule stream
(stream.py), with resume's code (resume.load_row / append_row: the same page sharing, the same ids).

Every record is validated before it touches anything, as a resume validates the log: the fingerprint, the
record's checksum and layout (format.decode_record), the state bounds (record_bounds), and its place in the
chain (a DELTA extends the last record applied; ids increase). A refused record raises RecordRefused and
changes nothing; the chain is then broken, so the replica skips DELTAs until the next RESYNC (a keyframe,
or one it asked for). So does a gap in the sequence numbers.

The replica's own capsules (what-if replan branches) take ids from LOCAL_IDS_FROM on, so they never collide
with the primary's ids, which count up from 1.

Every record names its timeline (Session.timeline: random per run, kept by persist_dir across a resume, handed
on to a standby that takes over). Ids are unique within one timeline only: a primary restarted without
persist_dir numbers from 1 again. A record of another timeline than the one held is a new run: the replica
skips until its keyframe, and once that passes every check drops everything it held (what-ifs too: they
branched from the old run) and starts over from it. Row 0 is the stream's cursor: only apply() changes it.
Pins are the primary's: a record's pinned flag is not copied, so the replica's store evicts oldest first.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..errors import CapsuleError
from .format import DELTA, LIVE, MAX_TIMELINE, RESET, RESYNC, LogCorrupt, Record, decode_record
from .resume import append_row, load_row, meta_reader
from .tap import layout_of

LOCAL_IDS_FROM = 1 << 61  # ids of the replica's own capsules; the primary's stay below (format.MAX_ID is 1 << 62)
# A leader of epoch e >= 2 (a standby that took over) numbers its capsules from e << EPOCH_ID_SHIFT: never an id
# an earlier leader gave out, heard or not (2^40 ids: 348 years at 100 Hz). The first primary (epoch 1) from 1.
EPOCH_ID_SHIFT = 40
MAX_EPOCH = (LOCAL_IDS_FROM >> EPOCH_ID_SHIFT) - 1


def epoch_ids(epoch: int) -> tuple[int, int]:
    """[first, end): the capsule ids a leader of ``epoch`` hands out."""
    return (1 if epoch <= 1 else epoch << EPOCH_ID_SHIFT), (epoch + 1) << EPOCH_ID_SHIFT


class RecordRefused(ValueError):
    """A stream record the replica did not apply; it changed nothing."""


@dataclass(frozen=True)
class ReplicaStats:
    applied: int
    refused: int  # forged, damaged, another fingerprint, out of chain
    gaps: int  # sequence numbers missing
    skipped: int  # DELTAs passed over while waiting for a RESYNC
    waiting_for_keyframe: bool
    last_seq: int
    last_id: int  # the capsule the replica's row 0 holds (0: none yet)
    last_step: int
    last_stamp_ns: int  # the primary's stamp of that capsule
    last_error: str


class StreamReplica:
    def __init__(self, session):
        self.session = session
        self.layout = layout_of(session)
        self.meta_of = meta_reader(session.arena)
        session.store.continue_ids_after(LOCAL_IDS_FROM - 1)
        self.last: Record | None = None
        self.inherited = 0  # new_source: the capsule the followed leader continued from
        # the timeline of the capsules held (0: none yet); a replica reactivated on a session that holds some
        # keeps theirs, so another run's keyframe still replaces them
        self.timeline = session.timeline if session.store.list() else 0
        self.last_seq = 0
        self.waiting = True  # for a RESYNC: nothing applied yet, or the chain broke
        self._applied = self._refused = self._gaps = self._skipped = 0
        self._last_error = ""
        self._cut_after: int | None = None  # new_source: the old leaders' capsules after this id go,
        self._cut_keep = (0, 0)  # but not the new leader's own ids [first, end)
        self.on_cut: Callable[[int, list[int]], None] = lambda after, gone: None  # told of the ids dropped
        self.on_new_run: Callable[[int, int, list[int]], None] = lambda old, new, gone: None  # likewise

    def stats(self) -> ReplicaStats:
        last = self.last
        return ReplicaStats(self._applied, self._refused, self._gaps, self._skipped, self.waiting, self.last_seq,
                            last.id if last else 0, last.step if last else 0, last.stamp_ns if last else 0,
                            self._last_error)

    def new_source(self, inherited_through: int, epoch: int) -> None:
        """Another node leads now, at ``epoch`` (a standby took over): its stream numbers records from its own
        start, and its timeline continues the old one from capsule ``inherited_through``. The old leaders'
        capsules after that one are not in its timeline, so they go (its own, the ids of its epoch, stay:
        a replica reactivated after the takeover); but only once a record of the new stream passed every
        check (a claim alone, which anyone on the domain can send, drops nothing). What-if capsules (local
        ids) stay. Waits for a keyframe."""
        self._cut_after, self._cut_keep = inherited_through, epoch_ids(epoch)
        self.inherited = inherited_through
        self.last, self.last_seq, self.waiting = None, 0, True

    def newest(self):
        """What a standby's takeover continues from (a Record or CapsuleInfo: id, step, stamp_ns), or None: the
        newest record applied; after new_source and before the new stream's first record applied, the capsule
        the new leader continued from, if held (it stepped on from there)."""
        if self.last is not None:
            return self.last
        s = self.session
        with s.lock:
            return s.store.get(self.inherited) if self.inherited and self.inherited in s.store else None

    def _cut(self) -> list[int]:
        """new_source's drop (the caller holds the session's lock); the ids dropped."""
        s, after, (keep_from, keep_end) = self.session, self._cut_after, self._cut_keep
        gone = [c.id for c in s.store.list() if after < c.id < LOCAL_IDS_FROM and not keep_from <= c.id < keep_end]
        for cid in gone:
            s.store.drop(cid)
        if s._live_id in gone:  # noqa: SLF001 - row 0 still holds that state, but no capsule names it
            s._live_id = 0  # noqa: SLF001
        self._cut_after = None
        return gone

    def lead(self, epoch: int) -> None:
        """This session leads the robot from here at ``epoch`` (a standby took over): its new capsules take
        the ids of that epoch, which replicas accept and no earlier leader gave out, and its own what-ifs go
        (their ids are every replica's what-if ids)."""
        if not 2 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch {epoch}: a leader after a takeover has an epoch in 2..{MAX_EPOCH}")
        s = self.session
        with s.lock:
            for cid in [c.id for c in s.store.list() if c.id >= LOCAL_IDS_FROM]:
                s.store.drop(cid)
            if self._cut_after is not None:  # it took over from the capsule a leader it followed continued from,
                self._cut()  # before that leader's first record: what older leaders recorded after it goes now
            newest = max((c.id for c in s.store.list()), default=0)
            s.store.number_after(max(newest, epoch_ids(epoch)[0] - 1), LOCAL_IDS_FROM)

    def apply(self, seq: int, fingerprint: str, blob: bytes, timeline: int) -> bool:
        """Apply one stream record of ``timeline``. True: applied; False: skipped (waiting for a RESYNC: ask for
        one). Raises RecordRefused (nothing changed, waiting for a RESYNC from here)."""
        if self.last_seq and seq != self.last_seq + 1:
            self._gaps += 1
            self.waiting = True
        self.last_seq = seq
        new_run = bool(self.timeline) and timeline != self.timeline
        if new_run:  # nothing held is of that run: only its keyframe can start it
            self.waiting = True
        try:
            rec = self._check(fingerprint, blob, timeline, new_run)
        except RecordRefused as e:
            self._refused += 1
            self._last_error = str(e)
            self.waiting = True
            raise
        if new_run and rec.kind == RESYNC:
            self._drop_all(timeline)
        elif not new_run and self._cut_after is not None and rec.kind != DELTA:  # the new leader's first that counts
            after = self._cut_after
            with self.session.lock:
                gone = self._cut()
            self.on_cut(after, gone)
        if new_run and rec.kind != RESYNC or self.waiting and rec.kind == DELTA \
                or rec.kind == LIVE and rec.id not in self.session.store:
            self._skipped += 1
            self.waiting = True
            return False
        self._apply(rec)
        if timeline != self.timeline:
            self.timeline = timeline
            self._adopt(timeline)
        self._applied += 1
        return True

    def _adopt(self, timeline: int) -> None:
        try:
            self.session.adopt_timeline(timeline)
        except OSError as e:  # the store holds the run already; only a later resume of this node is affected
            self._last_error = f"timeline {timeline:#x} not kept in persist_dir: {e}"

    def _drop_all(self, timeline: int) -> None:
        """A keyframe of another run passed every check: nothing held belongs to it. Waits for a running
        replan, so none of its what-ifs (branched from the old run) lands after the drop."""
        s, old = self.session, self.timeline
        with s._beside_no_replan():  # noqa: SLF001
            gone = [c.id for c in s.store.list()]
            for cid in gone:
                s.store.drop(cid)
            s._live_id = 0  # noqa: SLF001 - row 0 still holds the old run's state, but no capsule names it
        self.last, self._cut_after, self.timeline = None, None, timeline
        self._adopt(timeline)  # from here the new run's, even if its keyframe fails to apply
        self.on_new_run(old, timeline, gone)

    def _check(self, fingerprint: str, blob: bytes, timeline: int, new_run: bool) -> Record:
        """``new_run``: the record is of another timeline than the capsules held, so neither the chain nor the
        ids held say anything about it."""
        s = self.session
        if not 0 < timeline <= MAX_TIMELINE:
            raise RecordRefused(f"timeline {timeline}: a record names its run's timeline, 1..{MAX_TIMELINE}")
        if fingerprint != s.fingerprint:
            raise RecordRefused(f"record of fingerprint {fingerprint[:12]}, this replica runs {s.fingerprint[:12]} "
                                "(another config, weights or plan): give the replica the primary's parameters")
        try:
            rec = decode_record(blob, self.layout, self.meta_of, "capsule_stream")
        except LogCorrupt as e:
            raise RecordRefused(f"damaged or forged record: {e.why}") from None
        if rec.kind in (DELTA, RESYNC):
            try:
                s.record_bounds.check(rec.small, rec.kv, rec.kind == RESYNC)
            except ValueError as e:
                raise RecordRefused(f"capsule {rec.id}: {e}") from None
        last, held = (None, ()) if new_run else (self.last, s.store)
        if rec.kind == DELTA and not self.waiting and (
                last is None or rec.parent_id != last.id or rec.step - len(rec.kv) != last.step):
            raise RecordRefused(f"a delta of capsule {rec.parent_id} at step {rec.step - len(rec.kv)} does not "
                                f"follow capsule {last.id if last else 0} at step {last.step if last else 0}")
        if rec.kind == DELTA and rec.id in held:
            raise RecordRefused(f"a delta of capsule {rec.id}, which the replica holds already")
        if rec.id >= LOCAL_IDS_FROM:  # held or not: those ids are this replica's own what-ifs
            raise RecordRefused(f"capsule id {rec.id}: a leader's ids stay below {LOCAL_IDS_FROM}")
        fresh = rec.kind in (DELTA, RESYNC) and rec.id not in held
        if fresh and last is not None and rec.id <= last.id:
            raise RecordRefused(f"capsule id {rec.id} after {last.id if last else 0}: the primary's ids increase "
                                f"and stay below {LOCAL_IDS_FROM}")
        return rec

    def _as_delta(self, rec: Record) -> Record | None:
        """A keyframe that continues the chain (the stream turned a DELTA into it on schedule): its window is
        ours plus the new entries by construction (same parent, no gap), so only those are appended, not the
        whole window compared (a 4 MiB compare per keyframe held the records behind it ~50-100 ms)."""
        last, W = self.last, self.layout.kv_window
        if rec.kind != RESYNC or self.waiting or last is None or rec.parent_id != last.id \
                or not 0 <= rec.step - last.step <= W or rec.id in self.session.store:
            return None
        positions = np.arange(last.step, rec.step)
        entries = rec.kv[:, :, positions % W].transpose(2, 0, 1, 3)  # [n, n_layers, 2, d]
        return replace(rec, kind=DELTA, kv=entries)

    def _apply(self, rec: Record) -> None:
        s = self.session
        rec = self._as_delta(rec) or rec
        if rec.kind == RESET:
            s.reset()
            self.last, self.waiting = None, True  # the next capsule record stands alone (parent 0)
            return
        with s.lock, s.backend.activate():
            store = s.store
            try:
                if rec.id in store:  # a re-sent keyframe, a LIVE marker: the capsule the replica holds
                    store.restore(rec.id, 0)
                    info = store.get(rec.id)
                else:
                    if rec.kind == RESYNC:
                        sources = [*([store.pages_of(rec.parent_id)] if rec.parent_id in store else []),
                                   s.kv.tables[0]]
                        load_row(s, rec, sources)
                    else:
                        append_row(s, rec)
                    info = store.snapshot(0, step=rec.step, parent_id=rec.parent_id, stamp_ns=rec.stamp_ns,
                                          label=rec.label, cid=rec.id)
                    s.history.mark(info.id, None)  # the observations are the primary's
            except (ValueError, CapsuleError) as e:  # row 0 may be half-written: it holds no capsule now
                self.waiting = True
                self._last_error = f"capsule {rec.id}: {e}"
                raise RecordRefused(f"capsule {rec.id} could not be applied ({e}); waiting for a keyframe") from None
            s._step, s._live_id = info.step, info.id  # noqa: SLF001 - the replica's row 0 follows the primary's
            s.backend.sync()
        if rec.kind != LIVE:
            self.last = rec
        else:
            self.last = Record(RESYNC, info.id, info.parent_id, info.step, info.stamp_ns, False, "", rec.small,
                               rec.kv)
        self.waiting = False


__all__ = ["EPOCH_ID_SHIFT", "LOCAL_IDS_FROM", "MAX_EPOCH", "RecordRefused", "ReplicaStats", "StreamReplica",
           "epoch_ids"]
