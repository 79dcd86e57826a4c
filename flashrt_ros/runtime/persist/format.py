"""The on-disk capsule log: segment files of checksummed records (DESIGN.md, "State"; persist/writer.py writes,
resume.py reads).

A segment is ``seg-<first sequence number>.frl``: a header (magic, JSON with the fingerprint and the
layout, its crc32), then records back to back. A record is

    head    <4s B 3x I I>  magic b"FRR1", kind, payload length, crc32 over kind + length + payload
    info    <Q Q Q q B 3x I I>  id, parent_id, step, stamp_ns, pinned, n_entries, label length
    label   utf-8
    small   row_nbytes: the capsule's small state (recurrent, conv, mtp, meta, kv_pages)
    kv      float32, DELTA:  [n_entries, n_layers, 2, d_model]  positions [step - n_entries, step), n >= 0
                     RESYNC: [n_layers, 2, kv_window, d_model]  the whole window, slot = position % kv_window

A DELTA follows the record of its parent, so its window is the parent's plus its own entries. A RESYNC
stands alone: every segment starts with one, and so does the first record written after a drop or after
the timeline jumped (rollback, a committed replan). A LIVE marker (no state, only INFO) says that capsule
`id`, recorded earlier, became live without a new capsule (a rollback): a resume makes it live if it is the
last word. A RESET marker (INFO only, every field 0 but the stamp) says the live row was reset to zeros at
step 0, the capsules kept: a resume ends there if it is the last word. A pin file holds one RESYNC record of
a pinned capsule.

Reading validates everything before a byte reaches the runtime: magic, lengths, checksum, label, the
``meta`` invariants, the entry count, and finite floats. The first bad record ends a scan; the caller
decides whether that is a torn tail (cut) or corruption (refuse).
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..state.capsule_file import MAX_LABEL_CHARS, MAX_STAMP_NS, check_meta

SEGMENT_MAGIC = b"FRTLOG01"
SEGMENT_FORMAT = "flashrt-capsule-log/1"
SEGMENT_HEAD = struct.Struct("<8sII")  # magic, json length, crc32(json)
RECORD_HEAD = struct.Struct("<4sB3xII")
RECORD_MAGIC = b"FRR1"
INFO = struct.Struct("<QQQqB3xII")
DELTA, RESYNC, LIVE, RESET = 1, 2, 3, 4
KINDS = {DELTA: "delta", RESYNC: "resync", LIVE: "live", RESET: "reset"}
MARKERS = (LIVE, RESET)  # no state: they say what became live
EMPTY_SMALL, EMPTY_KV = np.zeros(0, np.uint8), np.zeros(0, np.float32)
MAX_SEGMENT_HEADER = 1 << 16
MAX_ID = 1 << 62  # ids count up from 1: a larger one is forged, and new ids after it would not fit the format


class LogCorrupt(ValueError):
    """A segment or record failed validation; names the file and byte offset."""

    def __init__(self, path: Path, offset: int, why: str):
        super().__init__(f"{path}: offset {offset}: {why}")
        self.path, self.offset, self.why = path, offset, why


@dataclass(frozen=True)
class LogLayout:
    """What a log's records must match: the runtime that wrote them."""
    fingerprint: str
    row_nbytes: int
    n_layers: int
    d_model: int
    kv_window: int

    @property
    def entry_floats(self) -> int:
        return self.n_layers * 2 * self.d_model

    def header(self) -> dict:
        return {"format": SEGMENT_FORMAT, "fingerprint": self.fingerprint, "row_nbytes": self.row_nbytes,
                "n_layers": self.n_layers, "d_model": self.d_model, "kv_window": self.kv_window}

    def max_payload(self) -> int:
        return INFO.size + 4 * MAX_LABEL_CHARS + self.row_nbytes + 4 * self.entry_floats * self.kv_window


@dataclass(frozen=True)
class Record:
    kind: int
    id: int
    parent_id: int
    step: int
    stamp_ns: int
    pinned: bool
    label: str
    small: np.ndarray  # [row_nbytes] uint8
    kv: np.ndarray  # DELTA: [n, n_layers, 2, d]; RESYNC: [n_layers, 2, kv_window, d]; float32
    offset: int = 0  # where it starts in its file
    nbytes: int = 0
    path: Path | None = None  # its file


def segment_header_bytes(layout: LogLayout) -> bytes:
    doc = json.dumps(layout.header(), sort_keys=True).encode()
    return SEGMENT_HEAD.pack(SEGMENT_MAGIC, len(doc), zlib.crc32(doc)) + doc


def encode_record(kind: int, info, small: bytes | np.ndarray, kv: np.ndarray, n_entries: int) -> bytes:
    """``info``: anything with id, parent_id, step, stamp_ns, pinned, label (a CapsuleInfo)."""
    return b"".join(record_parts(kind, info, small, kv, n_entries))


def record_parts(kind: int, info, small: bytes | np.ndarray, kv: np.ndarray, n_entries: int) -> list:
    """encode_record's bytes as the pieces they are joined from (header first), none copied: the disk writer
    hands them to os.writev, so a whole-window record (64 MiB at kv_window 16384) is not copied once more
    before it goes to the file while the records behind it wait (a kill -9 loses those)."""
    label = info.label.encode()
    # one copy of the KV (a keyframe's is the whole window, 4 MiB at the default model): the checksum runs over
    # the parts in place, and the record is joined once
    parts = (INFO.pack(info.id, info.parent_id, info.step, info.stamp_ns, bool(info.pinned), n_entries, len(label)),
             label, memoryview(small).cast("B"), memoryview(np.ascontiguousarray(kv, np.float32).reshape(-1)).cast("B"))
    n = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    crc = zlib.crc32(struct.pack("<BI", kind, n))
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [RECORD_HEAD.pack(RECORD_MAGIC, kind, n, crc), *parts]


def read_segment_header(path: Path, blob: bytes | memoryview, layout: LogLayout) -> int:
    """Validate a segment's header against ``layout``; returns where its first record starts. A header
    from another fingerprint raises FingerprintMismatch-worthy LogCorrupt with why starting 'fingerprint'."""
    if len(blob) < SEGMENT_HEAD.size:
        raise LogCorrupt(path, 0, f"{len(blob)} bytes: shorter than a segment header")
    magic, n, crc = SEGMENT_HEAD.unpack_from(blob, 0)
    if magic != SEGMENT_MAGIC:
        raise LogCorrupt(path, 0, "not a flashrt capsule log segment (bad magic)")
    if n > MAX_SEGMENT_HEADER or SEGMENT_HEAD.size + n > len(blob):
        raise LogCorrupt(path, 0, f"segment header length {n} is out of range")
    doc = bytes(blob[SEGMENT_HEAD.size:SEGMENT_HEAD.size + n])
    if zlib.crc32(doc) != crc:
        raise LogCorrupt(path, 0, "segment header checksum mismatch")
    try:
        head = json.loads(doc)
    except ValueError:
        raise LogCorrupt(path, 0, "segment header is not JSON") from None
    want = layout.header()
    if not isinstance(head, dict) or head.get("format") != SEGMENT_FORMAT:
        raise LogCorrupt(path, 0, f"segment format {head.get('format') if isinstance(head, dict) else head!r}, "
                                  f"expected {SEGMENT_FORMAT}")
    if head.get("fingerprint") != layout.fingerprint:
        raise LogCorrupt(path, 0, f"fingerprint {str(head.get('fingerprint'))[:12]} does not match this runtime's "
                                  f"{layout.fingerprint[:12]} (another config, weights or plan wrote it)")
    if head != want:
        raise LogCorrupt(path, 0, f"segment layout {head} does not match {want}")
    return SEGMENT_HEAD.size + n


def _decode(path: Path, blob, at: int, layout: LogLayout, meta_of: Callable[[np.ndarray], np.ndarray]) -> Record:
    if len(blob) - at < RECORD_HEAD.size:
        raise LogCorrupt(path, at, "torn record header")
    magic, kind, n, crc = RECORD_HEAD.unpack_from(blob, at)
    if magic != RECORD_MAGIC:
        raise LogCorrupt(path, at, "bad record magic")
    if kind not in KINDS:
        raise LogCorrupt(path, at, f"unknown record kind {kind}")
    if not INFO.size <= n <= layout.max_payload():
        raise LogCorrupt(path, at, f"record length {n} is out of range")
    start = at + RECORD_HEAD.size
    if len(blob) - start < n:
        raise LogCorrupt(path, at, f"torn record: {len(blob) - start} of {n} bytes")
    payload = memoryview(blob)[start:start + n]
    if zlib.crc32(payload, zlib.crc32(struct.pack("<BI", kind, n))) != crc:
        raise LogCorrupt(path, at, "record checksum mismatch")
    cid, parent, step, stamp, pinned, n_entries, label_len = INFO.unpack_from(payload, 0)
    off = INFO.size
    if not 0 <= stamp <= MAX_STAMP_NS:  # it goes out as a ROS Time (list_capsules, a replica's stream)
        raise LogCorrupt(path, at, f"record stamp {stamp} ns is out of range")
    if kind == RESET:  # a marker: the live row went back to zeros at step 0; nothing else
        if n != off or cid or parent or step or n_entries or label_len or pinned:
            raise LogCorrupt(path, at, "a reset marker holds its stamp only")
        return Record(kind, 0, 0, 0, stamp, False, "", EMPTY_SMALL, EMPTY_KV, at, RECORD_HEAD.size + n, path)
    if label_len > 4 * MAX_LABEL_CHARS or not 0 < cid < MAX_ID or parent >= MAX_ID or pinned > 1:
        raise LogCorrupt(path, at, "record info out of range (label, id or pinned)")
    if kind == LIVE:  # a marker: capsule `cid` (recorded before it) became live; nothing else
        if n != off or parent or n_entries or label_len or pinned:
            raise LogCorrupt(path, at, "a live marker holds its capsule id and step only")
        return Record(kind, cid, 0, step, stamp, False, "", EMPTY_SMALL, EMPTY_KV, at, RECORD_HEAD.size + n, path)
    if n < off + label_len + layout.row_nbytes:  # checked before a slice reads past the payload
        raise LogCorrupt(path, at, f"record holds {n} bytes, its label and small state need "
                                   f"{off + label_len + layout.row_nbytes}")
    try:
        label = bytes(payload[off:off + label_len]).decode()
    except UnicodeDecodeError:
        raise LogCorrupt(path, at, "label is not UTF-8") from None
    if len(label) > MAX_LABEL_CHARS:
        raise LogCorrupt(path, at, "record info out of range (label, id or pinned)")
    off += label_len
    small = np.frombuffer(payload, np.uint8, layout.row_nbytes, off)
    off += layout.row_nbytes
    e, w = layout.entry_floats, layout.kv_window
    floats = n_entries * e if kind == DELTA else e * w
    if kind == DELTA and not 0 <= n_entries <= w or kind == RESYNC and n_entries != min(step, w):
        raise LogCorrupt(path, at, f"{KINDS[kind]} record of step {step} with {n_entries} entries")
    if n - off != 4 * floats:
        raise LogCorrupt(path, at, f"record holds {n - off} KV bytes, expected {4 * floats}")
    kv = np.frombuffer(payload, np.float32, floats, off)
    try:
        check_meta(meta_of(small), step, w)
    except ValueError as ex:
        raise LogCorrupt(path, at, f"record meta: {ex}") from None
    if not np.isfinite(kv).all():
        raise LogCorrupt(path, at, "non-finite KV entries")
    L, d = layout.n_layers, layout.d_model
    shape = (n_entries, L, 2, d) if kind == DELTA else (L, 2, w, d)
    return Record(kind, cid, parent, step, stamp, bool(pinned), label, small, kv.reshape(shape), at,
                  RECORD_HEAD.size + n, path)


def decode_record(blob: bytes, layout: LogLayout, meta_of, where: str) -> Record:
    """One record that arrived on its own (the capsule stream), validated as a scan validates it, and
    nothing after it. Raises LogCorrupt naming ``where``."""
    rec = _decode(Path(where), blob, 0, layout, meta_of)
    if rec.nbytes != len(blob):
        raise LogCorrupt(Path(where), rec.nbytes, f"{len(blob) - rec.nbytes} bytes after the record")
    return rec


def scan(path: Path, blob, layout: LogLayout, meta_of) -> tuple[list[Record], LogCorrupt | None]:
    """Every valid record of a segment in order, and the error that ended the scan (None: clean end).
    A bad segment header raises."""
    at = read_segment_header(path, blob, layout)
    records: list[Record] = []
    while at < len(blob):
        try:
            rec = _decode(path, blob, at, layout, meta_of)
        except LogCorrupt as e:
            return records, e
        records.append(rec)
        at += rec.nbytes
    return records, None


def valid_record_after(path: Path, blob, at: int, layout: LogLayout, meta_of) -> int | None:
    """Where the first valid record past offset ``at`` starts, or None. A bad record followed by a valid
    one is damage inside the log, not a torn tail (a kill only ever tears the last record)."""
    find = blob.find if isinstance(blob, bytes) else bytes(blob).find
    hit = find(RECORD_MAGIC, at + 1)
    while hit >= 0:
        try:
            _decode(path, blob, hit, layout, meta_of)
            return hit
        except LogCorrupt:
            hit = find(RECORD_MAGIC, hit + 1)
    return None


def is_torn_header(blob, layout: LogLayout) -> bool:
    """A segment killed while its header was written: a strict prefix of the header this layout writes."""
    head = segment_header_bytes(layout)
    return len(blob) < len(head) and head.startswith(bytes(blob))


IDS_NAME = "ids.frl"  # the id reservation: no capsule id at or past its limit was ever handed out
IDS_MAGIC = b"FRTIDS01"
TIMELINE_NAME = "timeline.frl"  # the timeline's identity: a resumed node streams under the one it had
TIMELINE_MAGIC = b"FRTTLN01"
IDS = struct.Struct("<8sQI")  # magic, value, crc32 over magic + value (the id limit or the timeline)
MAX_ID_LIMIT = MAX_ID // 2  # a larger reservation is forged: blocks past it would leave the id range
MAX_TIMELINE = (1 << 64) - 1  # a CapsuleRecord's uint64; 0 is no timeline


def _encode_u64(magic: bytes, value: int) -> bytes:
    head = magic + struct.pack("<Q", value)
    return head + struct.pack("<I", zlib.crc32(head))


def _read_u64(path: Path, magic: bytes, what: str, top: int) -> int:
    """The value a small file of ``magic`` holds (0: no file). LogCorrupt for a damaged or forged one (they
    are replaced atomically: a kill never leaves half of one) or a value outside 1..top."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return 0
    if len(blob) != IDS.size:
        raise LogCorrupt(path, 0, f"{len(blob)} bytes: {what} holds {IDS.size}")
    got, value, crc = IDS.unpack(blob)
    if got != magic or zlib.crc32(blob[:-4]) != crc:
        raise LogCorrupt(path, 0, f"not {what} (bad magic or checksum)")
    if not 0 < value <= top:
        raise LogCorrupt(path, 0, f"{what}: {value} is out of range")
    return value


def encode_id_limit(limit: int) -> bytes:
    return _encode_u64(IDS_MAGIC, limit)


def read_id_limit(directory: Path) -> int:
    """The reserved id limit kept in ``directory`` (0: none). Raises LogCorrupt for a damaged or forged file."""
    return _read_u64(Path(directory) / IDS_NAME, IDS_MAGIC, "a flashrt id reservation", MAX_ID_LIMIT)


def encode_timeline(timeline: int) -> bytes:
    return _encode_u64(TIMELINE_MAGIC, timeline)


def read_timeline(directory: Path) -> int:
    """The timeline the log in ``directory`` belongs to (0: none kept). Raises LogCorrupt for a damaged file."""
    return _read_u64(Path(directory) / TIMELINE_NAME, TIMELINE_MAGIC, "a flashrt timeline file", MAX_TIMELINE)


def write_durably(directory: Path, name: str, blob: bytes) -> None:
    """``directory/name`` replaced by ``blob`` atomically and fsynced (file and directory): after a crash it
    holds the old bytes or the new ones, never half of either. Raises OSError."""
    path = Path(directory) / name
    tmp = path.with_name(f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, blob)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def pin_name(capsule_id: int) -> str:
    """The file that keeps a pinned capsule: one per capsule, named for it."""
    return f"pin-{capsule_id:016d}.frl"


def iter_segment_paths(directory: Path, prefix: str = "seg-") -> Iterator[Path]:
    """Segments in write order (the name holds the zero-padded first sequence number)."""
    yield from sorted(p for p in directory.glob(f"{prefix}*.frl") if p.is_file())
