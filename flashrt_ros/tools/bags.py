"""rosbag2 files through the `rosbags` package (no ROS tooling): read observations, write outputs.

Observations are converted with the node's own functions (flashrt_ros.ros.convert), so offline and
live replays see identical arrays. Every failure to read a bag becomes a BagError with a message.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

JOINT_STATE = "sensor_msgs/msg/JointState"
F32_ARRAY = "std_msgs/msg/Float32MultiArray"
F64_ARRAY = "std_msgs/msg/Float64MultiArray"
POLICY_STEP = "flashrt_interfaces/msg/PolicyStep"
OBSERVATION_TYPES = (JOINT_STATE, F32_ARRAY, F64_ARRAY)
STORAGES = ("mcap", "sqlite3")


class BagError(Exception):
    """A bag that cannot be replayed; the message says why."""


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
    here = Path(__file__).resolve().parents[2] / "flashrt_interfaces"
    if (here / "msg").is_dir():
        return here
    from ament_index_python.packages import get_package_share_directory
    return Path(get_package_share_directory("flashrt_interfaces"))


@dataclass
class ObservationSource:
    path: Path
    topic: str
    msgtype: str
    count: int


def open_observations(path: str | Path, topic: str | None = None) -> ObservationSource:
    """Pick the observation topic (the only observation-typed one, unless named)."""
    from rosbags.rosbag2 import Reader

    path = Path(path)
    if not path.exists():
        raise BagError(f"{path}: no such bag")
    try:
        with Reader(path) as reader:
            topics = {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}
    except Exception as e:  # noqa: BLE001 - rosbags raises many kinds for damaged files
        raise BagError(f"{path}: cannot read bag ({type(e).__name__}: {e})") from None
    if topic is not None:
        if topic not in topics:
            raise BagError(f"{path}: no topic {topic!r}; topics: {sorted(topics) or 'none'}")
        if topics[topic][0] not in OBSERVATION_TYPES:
            raise BagError(f"{path}: topic {topic} has type {topics[topic][0]}, expected one of "
                           f"{', '.join(OBSERVATION_TYPES)}")
    else:
        candidates = sorted(t for t, (mt, _) in topics.items() if mt in OBSERVATION_TYPES)
        if len(candidates) != 1:
            found = ", ".join(f"{t} [{mt}]" for t, (mt, _) in sorted(topics.items())) or "none"
            what = "no observation topic" if not candidates else f"{len(candidates)} observation topics"
            raise BagError(f"{path}: {what}; pass --topic. Topics: {found}")
        topic = candidates[0]
    msgtype, count = topics[topic]
    if count == 0:
        raise BagError(f"{path}: topic {topic} holds no messages")
    return ObservationSource(path, topic, msgtype, count)


def iter_messages(src: ObservationSource, ts) -> Iterator[tuple[int, object | None, str | None]]:
    """(bag timestamp ns, message or None, deserialisation error or None), in bag order."""
    from rosbags.rosbag2 import Reader

    try:
        with Reader(src.path) as reader:
            conns = [c for c in reader.connections if c.topic == src.topic]
            for conn, stamp, raw in reader.messages(connections=conns):
                try:
                    yield stamp, ts.deserialize_cdr(raw, conn.msgtype), None
                except Exception as e:  # noqa: BLE001 - one bad message is counted, not fatal
                    yield stamp, None, f"undecodable message ({type(e).__name__})"
    except BagError:
        raise
    except Exception as e:  # noqa: BLE001
        raise BagError(f"{src.path}: bag is damaged ({type(e).__name__}: {e})") from None


def header_stamp_ns(msg, bag_stamp_ns: int) -> int:
    header = getattr(msg, "header", None)
    if header is None:
        return bag_stamp_ns
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


@dataclass
class StepRecord:
    stamp_ns: int
    step: int
    capsule_id: int
    action: np.ndarray  # [action_dim] float32
    chunk: np.ndarray  # [chunk_len * action_dim] float32
    chunk_len: int
    latency_ms: float


def write_outputs(path: str | Path, storage: str, records: list[StepRecord], ts) -> None:
    """A rosbag2 with /action (Float64MultiArray) and /policy_step, stamped with the observation's stamp."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    if storage not in STORAGES:
        raise BagError(f"--storage must be one of {STORAGES}, got {storage!r}")
    path = Path(path)
    if path.exists():
        raise BagError(f"{path}: output exists; choose a new path")
    T = ts.types
    Time, Header = T["builtin_interfaces/msg/Time"], T["std_msgs/msg/Header"]
    Layout = T["std_msgs/msg/MultiArrayLayout"]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as w:
        c_action = w.add_connection("/action", F64_ARRAY, typestore=ts)
        c_step = w.add_connection("/policy_step", POLICY_STEP, typestore=ts)
        for r in records:
            stamp = Time(sec=r.stamp_ns // 1_000_000_000, nanosec=r.stamp_ns % 1_000_000_000)
            action = T[F64_ARRAY](layout=Layout(dim=[], data_offset=0), data=r.action.astype(np.float64))
            w.write(c_action, r.stamp_ns, ts.serialize_cdr(action, F64_ARRAY))
            step = T[POLICY_STEP](header=Header(stamp=stamp, frame_id=""), step=r.step, capsule_id=r.capsule_id,
                                  action=r.action.astype(np.float32), action_chunk=r.chunk.astype(np.float32),
                                  chunk_len=r.chunk_len, step_latency_ms=float(r.latency_ms))
            w.write(c_step, r.stamp_ns, ts.serialize_cdr(step, POLICY_STEP))


def read_policy_steps(path: str | Path, ts) -> list:
    """The /policy_step stream of an output bag, in order."""
    from rosbags.rosbag2 import Reader

    path = Path(path)
    if not path.exists():
        raise BagError(f"{path}: no such bag")
    try:
        with Reader(path) as reader:
            conns = [c for c in reader.connections if c.msgtype == POLICY_STEP]
            if not conns:
                raise BagError(f"{path}: no {POLICY_STEP} topic; topics: {[c.topic for c in reader.connections]}")
            return [ts.deserialize_cdr(raw, POLICY_STEP) for _, _, raw in reader.messages(connections=conns)]
    except BagError:
        raise
    except Exception as e:  # noqa: BLE001
        raise BagError(f"{path}: cannot read bag ({type(e).__name__}: {e})") from None


def write_joint_trace(path: str | Path, storage: str, obs: np.ndarray, t0_ns: int = 1_700_000_000_000_000_000,
                      period_ns: int = 10_000_000, topic: str = "/joint_states") -> Path:
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
                                              frame_id="base")
            msg = T[JOINT_STATE](header=header, name=names, position=o[:joints], velocity=o[joints:],
                                 effort=np.zeros(0))
            w.write(conn, ns, ts.serialize_cdr(msg, JOINT_STATE))
    return Path(path)
