"""The parts of flashrt-replay that offline and live runs share: the config, the observation stream (the
node's own conversion, joint_names included), reject counting, rollback checks and a streaming summary.
Nothing here grows with the length of the bag: memory is bounded by the config, not by the input.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import re
from collections import Counter, deque
from pathlib import Path

import numpy as np

from ...ros.io.convert import ObservationReader
from ...runtime.model.config import PolicyConfig, load_ros_params
from ...runtime.model.policy_file import resolve_policy_config
from ...runtime.state.capsule_file import MAX_STAMP_NS
from ..common import progress
from .bags import JOINT_STATE, BagError, OutputBag, StepRecord, header_frame_id, header_stamp_ns, iter_messages

SOURCE_CONFIG = Path(__file__).resolve().parents[3] / "config" / "flashrt.yaml"


class NodeFailed(Exception):
    """Live mode: the node could not be started, died, or stopped answering."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM; BaseException so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopSignals:
    """SIGINT / SIGTERM for flashrt-replay. Outside a deferred() block the handler raises Interrupted at
    once. Inside one (rclpy, the output bag, the per-message loops) it only records the signal, and the
    code raises it at its own safe points (check(), and the block's end): an exception raised by a signal
    handler while rclpy runs Python from C (a callback, a message conversion) becomes rclpy's
    "RuntimeError: Unable to convert call argument", and one raised half-way through a bag write leaves
    a broken bag."""

    def __init__(self):
        self.signum: int | None = None
        self._depth = 0

    def handler(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum
        if not self._depth:
            raise Interrupted(signum)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def deferred(self):
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        self.check()  # reached only when the block ended normally: a signal it held is raised now

    def reset(self) -> None:
        self.signum, self._depth = None, 0


STOP = StopSignals()


def bag_start_ns(files) -> int:
    """The earliest message time over every topic of the bag's storage files (rosbag2's starting_time)."""
    from rosbags.rosbag2 import Reader

    starts = []
    for f in files:
        try:
            with Reader(f) as reader:
                if reader.message_count:
                    starts.append(reader.start_time)
        except BagError:
            raise
        except Exception as e:  # noqa: BLE001 - rosbags raises many kinds for damaged files
            raise BagError(f"{f}: cannot read bag ({type(e).__name__}: {e})") from None
    return min(starts, default=0)


# ---- config -------------------------------------------------------------------------------------------
def default_config_path() -> Path:
    """The installed config (ament share of flashrt_ros), else the source tree's."""
    share_error = None
    try:
        from ament_index_python.packages import get_package_share_directory
        share = Path(get_package_share_directory("flashrt_ros")) / "config" / "flashrt.yaml"
        if share.is_file():
            return share
        share_error = f"{share} does not exist"
    except Exception as e:  # noqa: BLE001 - not installed, or AMENT_PREFIX_PATH unset
        share_error = f"{type(e).__name__}: {e}"
    if SOURCE_CONFIG.is_file():
        return SOURCE_CONFIG
    raise BagError(f"no default config: not in the ament share of flashrt_ros ({share_error}) nor in the source "
                   f"tree ({SOURCE_CONFIG}); pass --config")


class ReplayConfig:
    """The params file as the node reads it: the PolicyConfig plus the joint_names the node converts with."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else default_config_path()
        import yaml

        try:
            params = load_ros_params(self.path)
            # the file also holds the node's own parameters (joint_names, backend, ...): the policy takes its fields
            fields = {f.name for f in dataclasses.fields(PolicyConfig)}
            # policy_path: the file's architecture, so obs_dim is the policy's before the Session exists
            self.policy = resolve_policy_config(PolicyConfig.from_dict({k: v for k, v in params.items()
                                                                        if k in fields}))
        except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
            raise BagError(f"--config {self.path}: {' '.join(str(e).split())}") from None
        self.keyframe_s = float(params.get("stream_keyframe_s", 10.0))  # the node's, for the --out stream
        names = params.get("joint_names") or []
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise BagError(f"--config {self.path}: joint_names must be a list of strings, got {names!r}")
        self.joint_names: list[str] = names


def observation_type(msgtype: str) -> str:
    """The node's observation_type for a bag's message type (both array widths go in as float32_array)."""
    return "joint_state" if msgtype == JOINT_STATE else "float32_array"


# ---- rejects ------------------------------------------------------------------------------------------
class Rejections:
    """Counts by reason, numbers kept ("JointState gives 7 positions + 0 velocities = 7 values, obs_dim is
    14"). Past MAX_DISTINCT reasons, new ones are grouped by their wording with the numbers masked, so a
    bag of a million different bad values still takes bounded memory."""

    MAX_DISTINCT = 32

    def __init__(self):
        self.reasons: Counter = Counter()

    def add(self, reason: str) -> None:
        if reason not in self.reasons and len(self.reasons) >= self.MAX_DISTINCT:
            reason = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", reason) + " (numbers vary)"
        self.reasons[reason] += 1

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def summary(self) -> dict:
        return {"count": self.count, "reasons": dict(self.reasons.most_common())}


class ObservationStream:
    """The bag's observation messages converted exactly as the node converts them (the node's own
    ObservationReader, same joint_names, one reader for the whole stream as the node keeps one), so a
    joint order that changes mid-bag gives offline and live the same arrays; rejects are counted with
    their reasons and skipped. Without joint_names, JointStates whose names come in another order than
    the first one's are counted (joint_order_changes): only joint_names maps every message by name.
    Yields (bag stamp ns, observation stamp ns, frame_id, message, observation)."""

    def __init__(self, src, ts, cfg: ReplayConfig, start_offset_s: float = 0.0, after_stamp_ns: int | None = None,
                 read_from_ns: int | None = None):
        """``after_stamp_ns`` (--from): only observations stamped after it, read from bag time
        ``read_from_ns`` on (what is before is not read at all)."""
        self.src, self.ts = src, ts
        # as `ros2 bag play --start-offset`: seconds after the bag's first message (any topic)
        self.start_ns = bag_start_ns(src.files) + round(start_offset_s * 1e9) if start_offset_s > 0 else None
        self.after_stamp_ns, self.read_from_ns = after_stamp_ns, read_from_ns
        self.skipped = 0  # messages before the start offset: neither counted nor converted
        self.skipped_before_from = 0  # read, stamped at or before the restored state: stepped already
        self.obs_type = observation_type(src.msgtype)
        self.obs_dim, self.joint_names = cfg.policy.obs_dim, cfg.joint_names
        self.reader = ObservationReader(self.obs_type, self.obs_dim, self.joint_names)
        self.messages = 0
        self.rejected = Rejections()
        self.first_names: list[str] | None = None
        self.order_changes = 0
        self.first_order_change: int | None = None  # 1-based message number

    def __iter__(self):
        for stamp, msg, err in iter_messages(self.src, self.ts, self.read_from_ns):
            if self.start_ns is not None and stamp < self.start_ns:
                self.skipped += 1
                continue
            if self.after_stamp_ns is not None and err is None and header_stamp_ns(msg, stamp) <= self.after_stamp_ns:
                self.skipped_before_from += 1
                continue
            self.messages += 1
            if err is None:
                err, obs, stamp_ns = self._convert(msg, stamp)
            if err is not None:
                self.rejected.add(err)
                continue
            yield stamp, stamp_ns, header_frame_id(msg), msg, obs

    def _convert(self, msg, bag_stamp: int):
        try:
            obs = self.reader(msg)
        except ValueError as e:
            return str(e), None, None
        if self.obs_type == "joint_state" and not self.joint_names:
            self._note_order(list(msg.name))
        stamp_ns = header_stamp_ns(msg, bag_stamp)
        if stamp_ns < 0:  # rosbag2 times are unsigned: such a stamp cannot be recorded in an output bag
            return (f"header stamp is negative (sec={msg.header.stamp.sec}, nanosec={msg.header.stamp.nanosec}); "
                    "rosbag2 stores unsigned times"), None, None
        if stamp_ns > MAX_STAMP_NS:  # the capsule's stamp goes out as a ROS Time (int32 seconds), as in the node
            return (f"stamp {stamp_ns} ns is past the last ROS Time (int32 seconds, {MAX_STAMP_NS} ns, "
                    "January 2038)"), None, None
        return None, obs, stamp_ns


    def _note_order(self, names: list[str]) -> None:
        if self.first_names is None:
            self.first_names = names
        elif names != self.first_names:
            self.order_changes += 1
            if self.first_order_change is None:
                self.first_order_change = self.messages
                progress(f"warning: message {self.messages}: JointState names {names[:8]} differ from the first "
                         f"message's {self.first_names[:8]}; set joint_names in --config so every message is "
                         "mapped by name to one order")

    def start_summary(self) -> dict:
        return {} if self.start_ns is None else {"skipped_before_start_offset": self.skipped}

    def order_summary(self) -> dict | None:
        if not self.order_changes:
            return None
        return {"count": self.order_changes, "first_at_message": self.first_order_change,
                "first_names": self.first_names[:64]}


# ---- checks and summary -------------------------------------------------------------------------------
class RollbackChecks:
    """Every N steps: go back D steps, re-feed the same D observations, expect the same action bytes."""

    def __init__(self, every: int, depth: int):
        self.every, self.depth = every, depth
        self.recent_inputs: deque = deque(maxlen=max(depth, 1))
        self.recent_actions: deque = deque(maxlen=max(depth, 1))
        self.run = self.passed = 0

    def push(self, step_input, action: np.ndarray) -> None:
        self.recent_inputs.append(step_input)
        self.recent_actions.append(action)

    def due(self, steps: int) -> bool:
        return bool(self.every) and steps % self.every == 0 and steps >= self.depth

    def record(self, again: list[np.ndarray]) -> None:
        """`again`: the actions of the re-fed inputs, compared byte for byte with the originals."""
        ok = len(again) == len(self.recent_actions) and all(
            a.tobytes() == b.tobytes() for a, b in zip(again, self.recent_actions))
        self.run += 1
        self.passed += int(ok)


class LatencyHistogram:
    """p50 / p99 in fixed memory: log-spaced bins, 1% wide, from 1 µs to 100 s."""

    LO_MS, HI_MS, RATIO = 1e-3, 1e5, 1.01

    def __init__(self):
        self.n_bins = int(math.ceil(math.log(self.HI_MS / self.LO_MS) / math.log(self.RATIO))) + 1
        self.counts = np.zeros(self.n_bins, np.int64)

    def add(self, ms: float) -> None:
        x = min(max(float(ms), self.LO_MS), self.HI_MS)
        self.counts[int(math.log(x / self.LO_MS) / math.log(self.RATIO))] += 1

    def percentiles(self, *qs) -> dict:
        total = int(self.counts.sum())
        if total == 0:
            return {f"p{q}": None for q in qs}
        cum = np.cumsum(self.counts)
        out = {}
        for q in qs:
            i = int(np.searchsorted(cum, max(1, math.ceil(q / 100 * total))))
            out[f"p{q}"] = round(self.LO_MS * self.RATIO ** (i + 0.5), 4)  # the bin's geometric middle
        return out


class StepSink:
    """Takes each step as it happens: hashes the actions, bins the latency, writes the output bag."""

    def __init__(self, out: OutputBag | None):
        self.out = out
        self.steps = 0
        self._sha = hashlib.sha256()
        self.latency = LatencyHistogram()

    def add(self, r: StepRecord) -> None:
        self.steps += 1
        self._sha.update(np.asarray(r.action, np.float32).tobytes())
        self.latency.add(r.latency_ms)
        if self.out is not None:
            self.out.write(r)

    def summary(self, stream: ObservationStream, checks: RollbackChecks, wall_s: float) -> dict:
        return {"messages": stream.messages, "steps": self.steps, "rejected": stream.rejected.summary(),
                "actions_sha256": self._sha.hexdigest(), "step_latency_ms": self.latency.percentiles(50, 99),
                "rollback_checks": {"run": checks.run, "passed": checks.passed}, "wall_s": round(wall_s, 3),
                "steps_per_s": round(self.steps / wall_s, 1) if wall_s > 0 else None,
                **stream.start_summary(),
                **({"joint_order_changes": order} if (order := stream.order_summary()) else {})}
