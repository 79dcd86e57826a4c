"""Bounds on what an MCAP file can make flashrt-replay decompress.

rosbags decompresses each chunk whole, and while it merges chunks in time order it holds every chunk
whose time range overlaps the one being read. A few KiB of zstd can declare, or really hold, gigabytes.
So, before rosbags reads a file, check_mcap() walks its record headers (the data section and the
summary, without decompressing): each chunk must declare at most the limit uncompressed, and chunks that
overlap in time at most the limit together. While rosbags reads, bounded decompressors stand in for its
own: a chunk never decompresses to more than it declares, nor past the limit, nor to more message records
than the limit allows at MESSAGE_COST_BYTES each, counted over the chunks rosbags holds at once (it builds
Python objects for every message of a chunk when it opens it: 256 MiB of empty 31-byte records would be
8 M of them, about 1.5 GB).
"""
from __future__ import annotations

import functools
import struct
from pathlib import Path

from .bags import ChunkLimit

DEFAULT_MAX_DECOMPRESSED_MB = 256.0
MAGIC = b"\x89MCAP0\r\n"
OP_FOOTER, OP_MESSAGE, OP_CHUNK, OP_CHUNK_INDEX, OP_DATA_END = 0x02, 0x05, 0x06, 0x08, 0x0F
# What rosbags holds per message record of a chunk being read (a tuple, the data as bytes, the time as an
# int: about 150-190 B measured), rounded down: 256 MiB allows 2 M messages in one chunk, where a real
# bag's chunks (a few MiB) hold thousands.
MESSAGE_COST_BYTES = 128
FOOTER_LEN = 1 + 8 + 20 + len(MAGIC)

_limit_bytes = int(DEFAULT_MAX_DECOMPRESSED_MB * 2**20)
_held_messages = 0  # message records of the chunks rosbags has opened and not finished (its time-order merge)
_last_count = 0  # message records of the chunk decompressed last


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _advice() -> str:
    return (f"more than --max-decompressed-mb {_limit_bytes / 2**20:g} allows (a damaged or hostile file, or "
            "raise the limit for a bag you trust)")


def check_mcap(path: Path, limit_bytes: int) -> None:
    """Refuse the file (ChunkLimit) when a chunk declares more than limit_bytes uncompressed, or chunks
    overlapping in time do together. Walks record headers only; a record it cannot follow ends the walk
    (rosbags then reports the damage, and the bounded decompressors still hold)."""
    set_limit(limit_bytes)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 2 * len(MAGIC) + FOOTER_LEN:
            return
        f.seek(size - FOOTER_LEN)
        footer = f.read(FOOTER_LEN)
        summary_start = struct.unpack_from("<Q", footer, 9)[0] if footer[0] == OP_FOOTER else 0
        data_end = summary_start if len(MAGIC) < summary_start < size else size - FOOTER_LEN
        for offset, declared in _walk(f, len(MAGIC), data_end, OP_CHUNK):
            _check_one(path, offset, declared)
        if summary_start and data_end == summary_start:
            spans = []
            for offset, (start, end, declared) in _walk(f, summary_start, size - FOOTER_LEN, OP_CHUNK_INDEX):
                _check_one(path, offset, declared)
                spans.append((start, end, declared))
            _check_overlap(path, spans)


def _check_one(path: Path, offset: int, declared: int) -> None:
    if declared > _limit_bytes:
        raise ChunkLimit(f"{path}: the MCAP chunk at byte {offset} declares {_mib(declared)} uncompressed, "
                         f"{_advice()}")


def _check_overlap(path: Path, spans: list[tuple[int, int, int]]) -> None:
    """Chunks whose [start, end] bag-time ranges overlap are held together (the next one is opened at its
    start time, before the last message of the previous one, at the same time, is read)."""
    events = sorted([(s, 0, n) for s, _, n in spans] + [(e, 1, -n) for _, e, n in spans])
    held = count = most = most_count = 0
    at = None
    for t, _, n in events:
        held += n
        count += 1 if n > 0 else -1
        if held > most:
            most, most_count, at = held, count, t
    if most > _limit_bytes:
        raise ChunkLimit(f"{path}: {most_count} chunks overlapping in time (at bag time {at} ns) hold "
                         f"{_mib(most)} uncompressed together, {_advice()}")


def _walk(f, start: int, end: int, op_wanted: int):
    """(offset, fields) of each record with opcode op_wanted between start and end: the declared
    uncompressed size of a Chunk; (start, end, uncompressed size) of a ChunkIndex."""
    pos = start
    while pos + 9 <= end:
        f.seek(pos)
        op, length = struct.unpack("<BQ", f.read(9))
        if length > end - pos - 9:
            return
        if op == op_wanted == OP_CHUNK and length >= 24:
            yield pos, struct.unpack("<QQQ", f.read(24))[2]
        elif op == op_wanted == OP_CHUNK_INDEX:
            fields = _chunk_index(f, length)
            if fields is not None:
                yield pos, fields
        elif op in (OP_DATA_END, OP_FOOTER) and op_wanted == OP_CHUNK:
            return
        pos += 9 + length


def _chunk_index(f, length: int) -> tuple[int, int, int] | None:
    """(start, end, uncompressed size) of the ChunkIndex record whose body starts at f's position; its
    variable-length fields are skipped, not read. None when the record is too short (rosbags reports it)."""
    body = f.tell()
    try:
        start, end, _, _, n_offsets = struct.unpack("<QQQQI", f.read(36))
        f.seek(n_offsets + 8, 1)  # message_index_offsets, message_index_length
        (n_compression,) = struct.unpack("<I", f.read(4))
        f.seek(n_compression + 8, 1)  # compression, compressed_size
        (uncompressed,) = struct.unpack("<Q", f.read(8))
    except struct.error:
        return None
    return (start, end, uncompressed) if f.tell() <= body + length else None


# ---- bounded decompression while rosbags reads --------------------------------------------------------
def set_limit(limit_bytes: int) -> None:
    global _limit_bytes
    _limit_bytes = int(limit_bytes)
    _install()


def _bounded(new_decompressor, data: bytes, size: int) -> bytes:
    """Decompress every frame of `data`, stopping with ChunkLimit one byte past `size` (the chunk's
    declared uncompressed size) or past the limit."""
    _check_declared(size)
    out = bytearray()
    rest = data
    while rest:
        d = new_decompressor()
        out += d.decompress(rest, max_length=size + 1 - len(out))
        if len(out) > size:
            raise ChunkLimit(f"an MCAP chunk decompresses to more than the {size} bytes it declares (a damaged or "
                             "hostile file)")
        if not d.eof:  # truncated: rosbags compares the size and reports it
            break
        rest = d.unused_data
    _check_message_count(out)  # before the copy below, and before rosbags makes an object per message
    return bytes(out)


def _check_declared(size: int) -> None:
    if size > _limit_bytes:
        raise ChunkLimit(f"an MCAP chunk declares {_mib(size)} uncompressed, {_advice()}")


def _stored(data: bytes, size: int) -> bytes:
    """An uncompressed chunk ("" compression): nothing to decompress, the same limits (its size and its
    message records, each of which rosbags makes an object of)."""
    _check_declared(size)
    _check_message_count(data)
    return data


def _check_message_count(chunk: bytes | bytearray) -> None:
    """Refuse a decompressed chunk whose message records, with those of the chunks rosbags still holds, are
    more than the limit allows at MESSAGE_COST_BYTES each. Walks the record headers (opcode, uint64
    length) and stops at the first one past the limit; a record it cannot follow ends the walk (rosbags
    reports the damage)."""
    global _last_count
    most = _limit_bytes // MESSAGE_COST_BYTES
    left = most - _held_messages
    count, pos, end = 0, 0, len(chunk) - 9
    unpack = struct.Struct("<Q").unpack_from
    while pos <= end:
        if chunk[pos] == OP_MESSAGE:
            count += 1
            if count > left:
                where = "an MCAP chunk holds" if not _held_messages else \
                    "MCAP chunks overlapping in time hold together"
                raise ChunkLimit(f"{where} more than {most} message records, which take about "
                                 f"{MESSAGE_COST_BYTES} bytes each while read: {_advice()}")
        pos += 9 + unpack(chunk, pos + 1)[0]
    _last_count = count


def _held_counted(msgsrc):
    """rosbags' per-chunk message source (yields a start marker, then decompresses the chunk and yields its
    messages, all built at once), counted in _held_messages from the decompression until it is done."""
    def counted(*args, **kwargs):
        global _held_messages, _last_count
        source = msgsrc(*args, **kwargs)
        marker = next(source, None)
        if marker is None:
            return
        yield marker
        _last_count = 0
        first = next(source, None)  # decompresses: _check_message_count counts it with the chunks held
        if first is None:
            return
        mine, _last_count = _last_count, 0
        _held_messages += mine
        try:
            yield first
            yield from source
        finally:
            _held_messages -= mine

    counted.flashrt_counted = True
    return counted


def _zstd_decompressor():
    """The frame decompressor of the zstd module rosbags reads with (its requirement: the standard
    library's from Python 3.14, backports.zstd before); None where neither is importable."""
    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        try:
            from backports import zstd
        except ImportError:
            return None
    return zstd.ZstdDecompressor


def _lz4_decompressor():
    try:
        from lz4.frame import LZ4FrameDecompressor  # a requirement of rosbags
    except ImportError:
        return None
    return LZ4FrameDecompressor


def _install() -> None:
    """rosbags' table of chunk decompressors, called as fn(data, declared size): ours take their place.
    A compression whose module is missing (a rosbags built on other libraries) keeps rosbags' own
    decompressor: check_mcap's declared-size limits still hold for it."""
    from rosbags.rosbag2 import storage_mcap

    table = getattr(storage_mcap, "DECOMPRESSORS", None)
    if not isinstance(table, dict):  # another rosbags layout: check_mcap's declared-size limits still hold
        return
    for name, new_decompressor in (("zstd", _zstd_decompressor()), ("lz4", _lz4_decompressor())):
        if new_decompressor is not None and name in table:
            table[name] = functools.partial(_bounded, new_decompressor)
    if "" in table:
        table[""] = _stored
    msgsrc = getattr(storage_mcap, "msgsrc", None)
    if callable(msgsrc) and not getattr(msgsrc, "flashrt_counted", False):  # else: each chunk on its own
        storage_mcap.msgsrc = _held_counted(msgsrc)
