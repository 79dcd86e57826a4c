"""Messages <-> arrays, with validation. Shared by the node and flashrt-replay, so live and offline
runs see identical observations. Works on any object with the message's fields (rclpy or rosbags
classes alike); raises ValueError with a reason a robot engineer can act on.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ...runtime.inputs import MAX_LABEL_CHARS

OBSERVATION_TYPES = ("joint_state", "float32_array")


class JointNamesMismatch(ValueError):
    """A JointState whose names do not include every configured joint (a foreign or misconfigured
    publisher): refused, and reported as an error on /diagnostics."""


def joint_state_to_obs(msg, obs_dim: int, joint_names: Sequence[str] = ()) -> np.ndarray:
    """[positions..., velocities...] as float32 [obs_dim]. Names, positions and velocities must have one
    entry per joint, and names must be unique. With joint_names, values are taken by name in that order
    (extra joints in the message are ignored; a missing one raises JointNamesMismatch); otherwise in
    message order, names unchecked."""
    names = list(msg.name)
    pos = np.asarray(msg.position, dtype=np.float64)
    vel = np.asarray(msg.velocity, dtype=np.float64)
    if len(vel) == 0 and len(pos):  # a real driver's message: zero-filled velocities would be a robot at rest
        raise ValueError(f"JointState has {len(names)} names, {len(pos)} positions and 0 velocities: it carries "
                         "no velocities, and an observation is positions then velocities (not zero-filled)")
    if not (len(names) == len(pos) == len(vel)):
        raise ValueError(f"JointState has {len(names)} names, {len(pos)} positions and {len(vel)} velocities; "
                         "they must match one per joint")
    if len(set(names)) != len(names):
        dup = sorted(n for n, k in Counter(names).items() if k > 1)  # linear: a message may name 100k joints
        raise ValueError(f"JointState names joints {dup[:3]} more than once")
    if joint_names:
        index = {n: i for i, n in enumerate(names)}
        missing = [j for j in joint_names if j not in index]
        if missing:
            raise JointNamesMismatch(f"JointState lacks joints {_short(missing)} of joint_names (it names "
                                     f"{_short(names)}); refused: check which node publishes on 'observation', "
                                     "or fix joint_names")
        idx = [index[j] for j in joint_names]
        pos, vel = pos[idx], vel[idx]
    obs = np.concatenate([pos, vel])
    if obs.shape != (obs_dim,):
        raise ValueError(f"JointState gives {len(pos)} positions + {len(vel)} velocities = {obs.size} values, "
                         f"obs_dim is {obs_dim}")
    return _finite(obs.astype(np.float32))


def _short(names: Sequence[str], n: int = 8) -> str:
    shown = [str(x)[:40] for x in list(names)[:n]]
    return str(shown)[:-1] + (f", ... {len(names) - n} more]" if len(names) > n else "]")


class ObservationReader:
    """message -> observation for one stream, as the node and flashrt-replay convert it. The joint order
    comes from the configuration alone (joint_names), never from the messages: with joint_names a
    JointState is mapped by name and one that lacks a joint is refused (JointNamesMismatch); without,
    values are taken in message order."""

    def __init__(self, observation_type: str, obs_dim: int, joint_names: Sequence[str] = ()):
        if observation_type not in OBSERVATION_TYPES:
            raise ValueError(f"observation_type must be one of {OBSERVATION_TYPES}, got {observation_type!r}")
        self.observation_type, self.obs_dim = observation_type, obs_dim
        self.joint_names = list(joint_names)

    def __call__(self, msg) -> np.ndarray:
        return message_to_obs(msg, self.observation_type, self.obs_dim, self.joint_names)


def float_array_to_obs(msg, obs_dim: int) -> np.ndarray:
    """The array's values, from index 0. A nonzero layout.data_offset (leading padding) is refused rather
    than ignored: the padding would shift every value of the observation."""
    layout = getattr(msg, "layout", None)
    offset = getattr(layout, "data_offset", 0) or 0
    if offset:
        raise ValueError(f"layout.data_offset is {offset}: observations must start at index 0 of data "
                         "(publish without leading padding)")
    obs = np.asarray(msg.data, dtype=np.float64)
    if obs.shape != (obs_dim,):
        raise ValueError(f"array has {obs.size} values, obs_dim is {obs_dim}")
    return _finite(obs.astype(np.float32))


def message_to_obs(msg, observation_type: str, obs_dim: int, joint_names: Sequence[str] = ()) -> np.ndarray:
    """Dispatch by the node's observation_type; float arrays of either width are accepted."""
    if observation_type == "joint_state":
        return joint_state_to_obs(msg, obs_dim, joint_names)
    if observation_type == "float32_array":
        return float_array_to_obs(msg, obs_dim)
    raise ValueError(f"observation_type must be one of {OBSERVATION_TYPES}, got {observation_type!r}")


def _finite(obs: np.ndarray) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(obs))
    if bad.size:
        raise ValueError(f"non-finite value {obs[bad[0]]} at index {bad[0]}")
    return obs


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def ns_to_stamp(ns: int, stamp_cls):
    return stamp_cls(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def capsule_info_to_msg(info, msg_cls, time_cls):
    return msg_cls(id=info.id, parent_id=info.parent_id, step=info.step, stamp=ns_to_stamp(info.stamp_ns, time_cls),
                   label=info.label, pinned=info.pinned, nbytes=info.nbytes, resumed=info.resumed)


def replan_observations(flat: Sequence[float], branches: int, horizon: int, obs_dim: int) -> np.ndarray:
    """The Replan goal's row-major observations as [branches, horizon, obs_dim]; ValueError if malformed."""
    if branches < 1 or horizon < 1:
        raise ValueError(f"branches and horizon must be >= 1, got {branches} x {horizon}")
    want = branches * horizon * obs_dim
    arr = np.asarray(flat, dtype=np.float32)
    if arr.size != want:
        raise ValueError(f"observations has {arr.size} values, expected branches x horizon x obs_dim = "
                         f"{branches} x {horizon} x {obs_dim} = {want}")
    return _finite(arr).reshape(branches, horizon, obs_dim)


JOINT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_controller_joint_names(what: str, names: Sequence[str]) -> list[str]:
    """``names`` when each is a ROS name token a controller takes: ASCII letters, digits and underscores, not
    starting with a digit (ros2_control names a joint's interfaces ``<joint>/<interface>``, so a '/' splits
    one; a controller matches its ``joints`` parameter, a ROS string array, exactly). ValueError naming
    ``what`` and the first name that is not."""
    for i, name in enumerate(names):
        if not isinstance(name, str) or not JOINT_NAME.fullmatch(name):
            raise ValueError(f"{what}: {name!r} (index {i}) is not a joint name a controller takes: ASCII "
                             "letters, digits and underscores, not starting with a digit (no '/', spaces, dots "
                             "or other characters)")
    return list(names)


FILE_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_FILE_NAME = 128


def check_file_name(file_name: str) -> str:
    """A capsule file name inside capsule_dir: one component of [A-Za-z0-9._-], no leading dot (no
    hidden files, not '.' or '..'), at most 128 characters. No directories, so nothing to traverse."""
    if not file_name:
        raise ValueError("file_name must not be empty")
    if len(file_name) > MAX_FILE_NAME:
        raise ValueError(f"file_name has {len(file_name)} characters, at most {MAX_FILE_NAME} are allowed")
    bad = sorted({c for c in file_name if c not in FILE_NAME_CHARS})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:4])
        raise ValueError(f"file_name {file_name[:40]!r} contains {shown}: use only letters, digits, '.', '_' "
                         "and '-' (a plain name inside capsule_dir; no directories)")
    if file_name.startswith("."):
        raise ValueError(f"file_name {file_name!r} must not start with '.'")
    return file_name


def request_refusal(request) -> str:
    """Why a service request is refused on arrival, before it is queued or touches anything ('' = not):
    its strings over their bounds (a label is a name, a file name one path component). Answering at once
    means a huge request is dropped as soon as its answer is built."""
    label = getattr(request, "label", None)
    if isinstance(label, str) and len(label) > MAX_LABEL_CHARS:
        return f"label: at most {MAX_LABEL_CHARS} characters, got {len(label)}"
    file_name = getattr(request, "file_name", None)
    if isinstance(file_name, str) and len(file_name) > MAX_FILE_NAME:
        return f"file_name has {len(file_name)} characters, at most {MAX_FILE_NAME} are allowed"
    return ""
