"""rosbag2 files through the `rosbags` package (no ROS tooling): read observations, write outputs.

Reading streams message by message and trusts the storage files (.mcap channels and schemas, .db3 topics
table), not metadata.yaml: a stale message_count or a rewritten topic type there changes nothing. Output
bags are written as metadata version 8, the newest that Humble, Jazzy and Kilted all read (version 9 turns
offered_qos_profiles into a YAML list; Humble reads a string there). Every failure to read or write a bag
becomes a BagError with a message.
"""
from __future__ import annotations

import contextlib
import os
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

JOINT_STATE = "sensor_msgs/msg/JointState"
F32_ARRAY = "std_msgs/msg/Float32MultiArray"
F64_ARRAY = "std_msgs/msg/Float64MultiArray"
POLICY_STEP = "flashrt_interfaces/msg/PolicyStep"
CAPSULE_RECORD = "flashrt_interfaces/msg/CapsuleRecord"
STREAM_TOPIC = "/capsule_stream"  # in an output bag, beside /action and /policy_step
OBSERVATION_TYPES = (JOINT_STATE, F32_ARRAY, F64_ARRAY)
STORAGES = ("mcap", "sqlite3")
STORAGE_SUFFIXES = (".mcap", ".db3")
OUTPUT_METADATA_VERSION = 8  # Humble reads offered_qos_profiles as a string for version >= 4; 9 writes a list


class BagError(Exception):
    """A bag that cannot be replayed or written; the message says why."""


class ChunkLimit(BagError):
    """An MCAP chunk, or chunks overlapping in time, over the decompression limit (mcap_limits)."""


def check_regular(path: Path) -> Path:
    """``path`` when it is a regular file (a link to one counts: corpora link bags in); else BagError saying what
    it is. Before anything opens a bag's file: a FIFO would block the read for good, a link loop has no end."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise BagError(f"{path}: cannot read bag ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise BagError(f"{path}: {kind}, not a bag file: refused (never opened)")
    return path


def _open_storage(path: Path, max_decompressed_mb: float | None) -> tuple[list[Path], dict, dict]:
    """(storage files, metadata.yaml's topic types, the storage's topic types) of a bag that exists, its
    MCAP chunks checked against the decompression limit before anything is decompressed."""
    if not path.exists():
        if os.path.lexists(path):
            check_regular(path)  # a link loop or a dangling link: says which
        raise BagError(f"{path}: no such bag")
    files, meta_types = _storage_files(path)
    for f in files:
        check_regular(f)
    _check_decompression(files, max_decompressed_mb)
    return files, meta_types, _storage_topics(files)


def _check_decompression(files: list[Path], max_decompressed_mb: float | None) -> None:
    """Before rosbags opens anything: MCAP chunks within the limit, and rosbags' decompressors bounded."""
    from .mcap_limits import DEFAULT_MAX_DECOMPRESSED_MB, check_mcap, set_limit

    limit = int((max_decompressed_mb or DEFAULT_MAX_DECOMPRESSED_MB) * 2**20)
    set_limit(limit)
    for f in files:
        if f.suffix == ".mcap":
            try:
                check_mcap(f, limit)
            except OSError as e:
                raise BagError(f"{f}: cannot read bag ({type(e).__name__}: {e})") from None


def typestore():
    """Humble's message types plus flashrt_interfaces (from its .msg files)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    msg_dir = _interfaces_dir() / "msg"
    types = {}
    for f in sorted(msg_dir.glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"flashrt_interfaces/msg/{f.stem}"))
    ts.register(types)
    return ts


def _interfaces_dir() -> Path:
    here = Path(__file__).resolve().parents[3] / "flashrt_interfaces"
    if (here / "msg").is_dir():
        return here
    try:  # a colcon install: the .msg files are in the package's share directory
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory("flashrt_interfaces"))
    except Exception as e:  # noqa: BLE001 - not installed, or AMENT_PREFIX_PATH unset
        raise BagError(f"cannot find the flashrt_interfaces message definitions: not in the source tree "
                       f"({here}) nor in the ament index ({type(e).__name__}: {e}); source the workspace") from None


@dataclass
class ObservationSource:
    path: Path
    topic: str
    msgtype: str
    files: list[Path]  # the storage files, in order; a directory's metadata.yaml only names them
    notes: list[str] = field(default_factory=list)  # where metadata.yaml disagrees with the storage


def _storage_files(path: Path) -> tuple[list[Path], dict]:
    """The storage files of a bag (a directory or one file), and metadata.yaml's topic types (or {})."""
    if not path.is_dir():
        if path.suffix not in STORAGE_SUFFIXES:
            raise BagError(f"{path}: not a rosbag2 storage file (expected {' or '.join(STORAGE_SUFFIXES)})")
        return [path], {}
    meta = _read_metadata(path)
    listed = meta.get("relative_file_paths")  # metadata.yaml is a hint: the wrong type of anything is ignored
    named = [path / Path(p).name for p in (listed if isinstance(listed, list) else []) if isinstance(p, str)]
    files = [p for p in named if p.is_file()] or sorted(p for p in path.iterdir() if p.suffix in STORAGE_SUFFIXES)
    if not files:
        raise BagError(f"{path}: cannot read bag (no .mcap or .db3 file in the directory)")
    mode = meta.get("compression_mode")
    if isinstance(mode, str) and mode.lower() in ("file", "message"):
        raise BagError(f"{path}: compressed bags are not supported; decompress with "
                       "`rosbags-convert` or `ros2 bag convert` first")
    types = {}
    for t in meta.get("topics_with_message_count") or []:
        with contextlib.suppress(AttributeError, KeyError, TypeError):
            types[t["topic_metadata"]["name"]] = t["topic_metadata"]["type"]
    return files, types


def _read_metadata(path: Path) -> dict:
    """metadata.yaml's rosbag2_bagfile_information, or {} when missing or unreadable (the storage decides)."""
    import yaml

    try:
        check_regular(path / "metadata.yaml")
    except BagError:
        return {}  # missing, or a FIFO that would block the read
    try:
        doc = yaml.safe_load((path / "metadata.yaml").read_text())
        info = doc.get("rosbag2_bagfile_information") if isinstance(doc, dict) else None
        return info if isinstance(info, dict) else {}
    except (OSError, yaml.YAMLError):
        return {}


def _storage_topics(files: list[Path]) -> dict[str, str]:
    """topic -> type as the storage files themselves declare it (mcap channels/schemas, db3 topics table)."""
    from rosbags.rosbag2 import Reader

    topics: dict[str, str] = {}
    for f in files:
        try:
            with Reader(f) as reader:
                for c in reader.connections:
                    if topics.setdefault(c.topic, c.msgtype) != c.msgtype:
                        raise BagError(f"{f}: topic {c.topic} has two types, {topics[c.topic]} and {c.msgtype}")
        except ChunkLimit as e:  # from a bounded decompressor inside rosbags
            raise BagError(f"{f}: {e}") from None
        except BagError:
            raise
        except Exception as e:  # noqa: BLE001 - rosbags raises many kinds for damaged files
            raise BagError(f"{f}: cannot read bag ({type(e).__name__}: {e})") from None
    return topics


def open_observations(path: str | Path, topic: str | None = None,
                      max_decompressed_mb: float | None = None) -> ObservationSource:
    """Pick the observation topic (the only observation-typed one, unless named), from the storage.
    MCAP chunks may hold at most max_decompressed_mb (default 256) decompressed at once."""
    path = Path(path)
    files, meta_types, topics = _open_storage(path, max_decompressed_mb)
    notes = [f"metadata.yaml says {t} is {mt}, the storage says {topics.get(t, 'nothing')}: using the storage"
             for t, mt in sorted(meta_types.items()) if topics.get(t) != mt]
    if topic is not None:
        if topic not in topics:
            raise BagError(f"{path}: no topic {topic!r}; topics: {sorted(topics) or 'none'}")
        if topics[topic] not in OBSERVATION_TYPES:
            raise BagError(f"{path}: topic {topic} has type {topics[topic]}, expected one of "
                           f"{', '.join(OBSERVATION_TYPES)}")
    else:
        candidates = sorted(t for t, mt in topics.items() if mt in OBSERVATION_TYPES)
        if len(candidates) != 1:
            found = ", ".join(f"{t} [{mt}]" for t, mt in sorted(topics.items())) or "none"
            what = "no observation topic" if not candidates else f"{len(candidates)} observation topics"
            raise BagError(f"{path}: {what}; pass --topic. Topics: {found}")
        topic = candidates[0]
    return ObservationSource(path, topic, topics[topic], files, notes)


def decode_cdr(ts, raw: bytes | memoryview, typename: str):
    """``ts.deserialize_cdr(raw, typename)``, which also accepts the trailing bytes rclpy leaves: its
    serialize_message (rmw_fastrtps) sizes the buffer by Fast-CDR's estimate, which aligns an empty
    float64/int64 sequence to 8 as if it had items, so a JointState with an empty `effort` ends 4 to 12
    bytes past its last field, where rosbags allows 3. Those bytes are uninitialised memory, not zeros:
    only their number is checked, against that estimate. A truncated message, or more bytes than the
    estimate (rounded up to 4, DDS's own padding), is refused with rosbags' SerdeError."""
    from rosbags.serde import SerdeError

    if len(raw) < 4 or bytes(raw[:2]) not in (b"\x00\x00", b"\x00\x01"):
        raise SerdeError("Invalid or unsupported CDR encapsulation.")
    msgdef = ts.get_msgdef(typename)
    func = msgdef.deserialize_cdr_le if raw[1] else msgdef.deserialize_cdr_be
    payload = raw[4:]
    try:
        msg, end = func(payload, 0, msgdef.cls, ts)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        raise SerdeError(f"Could not deserialize {typename!r}: {e}") from e
    extra = len(payload) - end
    if extra > 3 and len(payload) > _align(fastcdr_estimate(ts, msg, typename), 4):
        raise SerdeError(f"CDR message size mismatch for {typename!r}: {extra} bytes after the message")
    return msg


def _align(pos: int, size: int) -> int:
    return pos + (-pos % size)


def fastcdr_estimate(ts, msg, typename: str) -> int:
    """The payload size (encapsulation excluded) rclpy's serialize_message gives ``msg`` with rmw_fastrtps:
    the CDR layout, except that an empty sequence of 8-byte items is still aligned to 8."""
    from rosbags.interfaces import Nodetype
    from rosbags.serde.utils import SIZEMAP

    def end(pos: int, value, desc) -> int:
        kind, arg = desc
        if kind == Nodetype.NAME:
            for name, sub in ts.get_msgdef(arg).fields:
                pos = end(pos, getattr(value, name), sub)
            return pos
        if kind == Nodetype.BASE:
            if arg[0] == "string":
                return _align(pos, 4) + 4 + len(value.encode()) + 1
            return _align(pos, SIZEMAP[arg[0]]) + SIZEMAP[arg[0]]
        sub = arg[0]
        if kind == Nodetype.SEQUENCE:
            pos = _align(pos, 4) + 4
        if sub[0] == Nodetype.BASE and sub[1][0] != "string":
            size = SIZEMAP[sub[1][0]]
            return _align(pos, size) + len(value) * size  # aligned even when empty: the quirk
        for item in value:
            pos = end(pos, item, sub)
        return pos

    return end(0, msg, (Nodetype.NAME, typename))


def iter_messages(src: ObservationSource, ts, start_ns: int | None = None) -> Iterator[tuple[int, object | None,
                                                                                             str | None]]:
    """(bag timestamp ns, message or None, deserialisation error or None), in storage order, one at a time;
    from bag time ``start_ns`` on (the storage's index skips what is before it, unread)."""
    from rosbags.rosbag2 import Reader

    for f in src.files:
        try:
            with Reader(f) as reader:
                conns = [c for c in reader.connections if c.topic == src.topic]
                for conn, stamp, raw in reader.messages(connections=conns, start=start_ns):
                    try:
                        msg = decode_cdr(ts, raw, conn.msgtype)
                    except Exception as e:  # noqa: BLE001 - one bad message is counted, not fatal
                        yield stamp, None, f"undecodable {conn.msgtype} ({type(e).__name__})"
                        continue
                    yield stamp, msg, None
        except ChunkLimit as e:  # from a bounded decompressor inside rosbags
            raise BagError(f"{f}: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise BagError(f"{f}: bag is damaged ({type(e).__name__}: {e})") from None


def header_stamp_ns(msg, bag_stamp_ns: int) -> int:
    header = getattr(msg, "header", None)
    if header is None:
        return bag_stamp_ns
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def header_frame_id(msg) -> str:
    header = getattr(msg, "header", None)
    return str(header.frame_id) if header is not None else ""


@dataclass
class StepRecord:
    stamp_ns: int  # >= 0: rosbag2 timestamps are unsigned
    step: int
    capsule_id: int
    action: np.ndarray  # [action_dim] float32
    chunk: np.ndarray  # [chunk_len * action_dim] float32
    chunk_len: int
    latency_ms: float
    frame_id: str = ""


def check_new_output(path: str | Path) -> Path:
    """Refuse an --out that exists or cannot be created, before any replay work."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise BagError(f"{path}: output exists; choose a new path")
    if not path.parent.is_dir():
        raise BagError(f"{path}: parent directory {path.parent} does not exist")
    return path


def check_json_output(path: str | Path) -> Path:
    """Refuse a --json that could not be written at the end (a directory, a missing or unwritable directory),
    before any replay work: a long run must not end in a traceback."""
    path = Path(path)
    if path.is_dir():
        raise BagError(f"--json {path}: is a directory; name a file")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise BagError(f"--json {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise BagError(f"--json {path}: not writable")
    return path


def _output_qos(transient_local: bool = False):
    """What the node offers by default (ros/io/qos.py): reliable, keep last 10; action volatile, policy_step
    transient-local (step_link.policy_step_qos), so `ros2 bag play` matches the same subscribers."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    zero = QosTime(0, 0)
    durability = QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE
    return [Qos(QosHistory.KEEP_LAST, 10, QosReliability.RELIABLE, durability, zero, zero,
                QosLiveliness.AUTOMATIC, zero, False)]


class OutputBag:
    """A new rosbag2 with /action (Float64MultiArray), /policy_step and /capsule_stream (the capsule records
    of the run: flashrt_interfaces/CapsuleRecord, each at its step's stamp), written one step at a time and
    stamped with the observation's stamp. Thread-safe: the capsule records come from the stream's thread."""

    def __init__(self, path: str | Path, storage: str, ts):
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise BagError(f"--storage must be one of {STORAGES}, got {storage!r}")
        self.path, self.ts = check_new_output(path), ts
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self._writer = Writer(self.path, version=OUTPUT_METADATA_VERSION, storage_plugin=plugin)
        try:
            self._writer.open()
        except Exception as e:  # noqa: BLE001 - exists now (a race), permissions, full disk
            raise BagError(f"{self.path}: cannot create output bag ({type(e).__name__}: {e})") from None
        self._c_action = self._writer.add_connection("/action", F64_ARRAY, typestore=ts,
                                                     offered_qos_profiles=_output_qos())
        self._c_step = self._writer.add_connection("/policy_step", POLICY_STEP, typestore=ts,
                                                   offered_qos_profiles=_output_qos(transient_local=True))
        self._c_stream = self._writer.add_connection(STREAM_TOPIC, CAPSULE_RECORD, typestore=ts,
                                                     offered_qos_profiles=_output_qos())
        self._lock = threading.Lock()
        T = ts.types
        self._time, self._header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
        self._layout, self._f64, self._step = T["std_msgs/msg/MultiArrayLayout"], T[F64_ARRAY], T[POLICY_STEP]
        self._record = T[CAPSULE_RECORD]

    def write_capsule_record(self, rec, fingerprint: str, epoch: int = 1) -> None:
        """A runtime StreamRecord (persist/stream.py), at its step's stamp."""
        msg = self._record(stamp=self._time(sec=rec.stamp_ns // 1_000_000_000, nanosec=rec.stamp_ns % 1_000_000_000),
                           seq=rec.seq, epoch=epoch, timeline=rec.timeline, kind=rec.kind, capsule_id=rec.capsule_id,
                           parent_id=rec.parent_id, step=rec.step, fingerprint=fingerprint,
                           record=np.frombuffer(rec.blob, np.uint8), mac="")
        self.write_capsule_record_cdr(rec.stamp_ns, self.ts.serialize_cdr(msg, CAPSULE_RECORD))

    def write_capsule_record_cdr(self, stamp_ns: int, cdr: bytes) -> None:
        """A CapsuleRecord already serialised (one received over DDS, rclpy's serialize_message)."""
        with self._lock:
            self._writer.write(self._c_stream, stamp_ns, cdr)

    def write(self, r: StepRecord) -> None:
        stamp = self._time(sec=r.stamp_ns // 1_000_000_000, nanosec=r.stamp_ns % 1_000_000_000)
        action = self._f64(layout=self._layout(dim=[], data_offset=0), data=r.action.astype(np.float64))
        step = self._step(header=self._header(stamp=stamp, frame_id=r.frame_id), step=r.step,
                          capsule_id=r.capsule_id, action=r.action.astype(np.float32),
                          action_chunk=r.chunk.astype(np.float32), chunk_len=r.chunk_len,
                          step_latency_ms=float(r.latency_ms), epoch=1)  # one run: one leader
        with self._lock:
            self._writer.write(self._c_action, r.stamp_ns, self.ts.serialize_cdr(action, F64_ARRAY))
            self._writer.write(self._c_step, r.stamp_ns, self.ts.serialize_cdr(step, POLICY_STEP))

    def close(self) -> None:
        with self._lock:
            self._writer.close()

    def __enter__(self) -> OutputBag:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_outputs(path: str | Path, storage: str, records, ts) -> None:
    """All records into a new output bag (tests and tools that already hold the records)."""
    with OutputBag(path, storage, ts) as out:
        for r in records:
            out.write(r)


def iter_policy_steps(path: str | Path, ts) -> Iterator:
    """The /policy_step stream of an output bag, in order, one message at a time."""
    path = Path(path)
    files, _, topics = _open_storage(path, None)
    steps = [t for t, mt in topics.items() if mt == POLICY_STEP]
    if not steps:
        raise BagError(f"{path}: no {POLICY_STEP} topic; topics: {sorted(topics)}")
    from rosbags.rosbag2 import Reader

    for f in files:
        try:
            with Reader(f) as reader:
                conns = [c for c in reader.connections if c.msgtype == POLICY_STEP]
                for _, _, raw in reader.messages(connections=conns):
                    yield decode_cdr(ts, raw, POLICY_STEP)
        except ChunkLimit as e:
            raise BagError(f"{f}: {e}") from None
        except Exception as e:  # noqa: BLE001
            raise BagError(f"{f}: cannot read bag ({type(e).__name__}: {e})") from None


def iter_capsule_records(path: str | Path, ts, start_ns: int | None = None,
                         stop_ns: int | None = None) -> Iterator[tuple[int, object]]:
    """(bag time, CapsuleRecord) of a bag's capsule stream (one topic of that type), in order, from bag time
    ``start_ns`` up to ``stop_ns`` (excluded); the storage's index skips the rest unread."""
    path = Path(path)
    files, _, topics = _open_storage(path, None)
    streams = sorted(t for t, mt in topics.items() if mt == CAPSULE_RECORD)
    if len(streams) != 1:
        raise BagError(f"{path}: {'no' if not streams else len(streams)} {CAPSULE_RECORD} topic"
                       f"{'' if not streams else 's'} (a capsule stream: flashrt-replay --out, or a recording of "
                       f"~/capsule_stream); topics: {sorted(topics)}")
    from rosbags.rosbag2 import Reader

    for f in files:
        try:
            with Reader(f) as reader:
                conns = [c for c in reader.connections if c.topic == streams[0]]
                for _, stamp, raw in reader.messages(connections=conns, start=start_ns, stop=stop_ns):
                    yield stamp, decode_cdr(ts, raw, CAPSULE_RECORD)
        except ChunkLimit as e:
            raise BagError(f"{f}: {e}") from None
        except BagError:
            raise
        except Exception as e:  # noqa: BLE001
            raise BagError(f"{f}: cannot read bag ({type(e).__name__}: {e})") from None


def read_policy_steps(path: str | Path, ts) -> list:
    return list(iter_policy_steps(path, ts))


def write_joint_trace(path: str | Path, storage: str, obs: np.ndarray, t0_ns: int = 1_700_000_000_000_000_000,
                      period_ns: int = 10_000_000, topic: str = "/joint_states", frame_id: str = "base") -> Path:
    """A JointState bag from obs[n, 2 * joints] (positions then velocities), one message per period."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    joints = obs.shape[1] // 2
    names = [f"joint{i}" for i in range(joints)]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(Path(path), version=9, storage_plugin=plugin) as w:
        conn = w.add_connection(topic, JOINT_STATE, typestore=ts)
        for i, o in enumerate(np.asarray(obs, np.float64)):
            ns = t0_ns + i * period_ns
            header = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9,
                                                                                  nanosec=ns % 10**9),
                                              frame_id=frame_id)
            msg = T[JOINT_STATE](header=header, name=names, position=o[:joints], velocity=o[joints:],
                                 effort=np.zeros(0))
            w.write(conn, ns, ts.serialize_cdr(msg, JOINT_STATE))
    return Path(path)
