"""flashrt-replay --from SECONDS: enter a bag in the middle, byte-exactly, from its capsule stream.

The stream's RESYNC records are keyframes (at least every stream_keyframe_s). To start at bag time T, the
replay restores the last keyframe before T and applies the DELTAs after it up to T, through the runtime's
replica (the same validation as a replica over DDS: a damaged or forged record is refused, never applied),
then steps the observations after the newest record applied. Only the records of that stretch are read
(the storage's time index skips the rest), so entering at minute 7 costs what lies between the keyframe
and minute 7, not minutes 0-7.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ...runtime.persist.format import RESYNC
from ...runtime.persist.replica import RecordRefused, StreamReplica
from .bags import BagError, iter_capsule_records

WINDOW_SLACK_S = 1.0  # bag time searched back for a keyframe first: stream_keyframe_s and this


@dataclass(frozen=True)
class Restored:
    step: int  # the step the session is at: the next observation stepped is step + 1
    stamp_ns: int  # the newest record's stamp: observations stamped after it are stepped
    keyframe_step: int
    keyframe_stamp_ns: int
    records_read: int
    records_applied: int
    elapsed_s: float

    def summary(self) -> dict:
        return {"restored_step": self.step, "keyframe_step": self.keyframe_step,
                "keyframe_stamp_ns": self.keyframe_stamp_ns, "records_read": self.records_read,
                "records_applied": self.records_applied, "restore_s": round(self.elapsed_s, 4)}


def _stamp(msg) -> int:
    return int(msg.stamp.sec) * 1_000_000_000 + int(msg.stamp.nanosec)


def _keyframe_before(stream_bag, ts, until_ns: int, bag_start_ns: int, keyframe_s: float) -> tuple[list, int]:
    """The records from the last RESYNC before ``until_ns`` up to it, and how many were read to find it.
    The window (one keyframe interval and WINDOW_SLACK_S) doubles back until it holds a keyframe or reaches
    the bag's start: a stream recorded with a longer interval costs a few more reads, never a wrong state."""
    window, read = int((keyframe_s + WINDOW_SLACK_S) * 1e9), 0
    while True:
        start = max(bag_start_ns, until_ns - window)
        records = [m for _, m in iter_capsule_records(stream_bag, ts, start, until_ns)]
        read += len(records)
        keys = [i for i, m in enumerate(records) if m.kind == RESYNC]
        if keys:
            return records[keys[-1]:], read
        if start <= bag_start_ns:
            raise BagError(f"{stream_bag}: no keyframe (RESYNC record) of the capsule stream before the --from "
                           "time; start later, or replay from the beginning")
        window *= 2


def restore(session, stream_bag, ts, until_ns: int, bag_start_ns: int, keyframe_s: float) -> Restored:
    """``session`` becomes the recorded run's state at its newest record stamped before ``until_ns``;
    ``keyframe_s``: the stream's keyframe interval (the config's stream_keyframe_s)."""
    t0 = time.perf_counter()
    records, read = _keyframe_before(stream_bag, ts, until_ns, bag_start_ns, keyframe_s)
    replica = StreamReplica(session)
    applied = 0
    for msg in records:
        try:
            applied += replica.apply(int(msg.seq), msg.fingerprint, bytes(msg.record), int(msg.timeline))
        except RecordRefused as e:
            raise BagError(f"{stream_bag}: capsule record {msg.seq} (step {msg.step}) refused: {e}") from None
        if replica.waiting:
            raise BagError(f"{stream_bag}: the capsule stream has a gap after record {replica.last_seq} (step "
                           f"{msg.step}), between the keyframe and the --from time; pick another --from")
    last = replica.last
    if last is None:
        raise BagError(f"{stream_bag}: no capsule record could be restored before the --from time")
    return Restored(session.step_count, last.stamp_ns, int(records[0].step), _stamp(records[0]), read, applied,
                    time.perf_counter() - t0)
