"""Messages <-> arrays, with validation. Shared by the node and flashrt-replay, so live and offline
runs see identical observations. Works on any object with the message's fields (rclpy or rosbags
classes alike); raises ValueError with a reason a robot engineer can act on.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OBSERVATION_TYPES = ("joint_state", "float32_array")


def joint_state_to_obs(msg, obs_dim: int, joint_names: Sequence[str] = ()) -> np.ndarray:
    """[positions..., velocities...] as float32 [obs_dim]. With joint_names, values are taken by name in
    that order (extra joints in the message are ignored); otherwise in message order."""
    pos = np.asarray(msg.position, dtype=np.float64)
    vel = np.asarray(msg.velocity, dtype=np.float64)
    if joint_names:
        names = list(msg.name)
        if len(names) != len(pos):
            raise ValueError(f"JointState has {len(names)} names but {len(pos)} positions")
        missing = [j for j in joint_names if j not in names]
        if missing:
            raise ValueError(f"JointState lacks joints {missing[:3]} (has {names[:8]})")
        idx = [names.index(j) for j in joint_names]
        if len(vel) != len(pos):
            raise ValueError(f"JointState has {len(pos)} positions but {len(vel)} velocities")
        pos, vel = pos[idx], vel[idx]
    obs = np.concatenate([pos, vel])
    if obs.shape != (obs_dim,):
        raise ValueError(f"JointState gives {len(pos)} positions + {len(vel)} velocities = {obs.size} values, "
                         f"obs_dim is {obs_dim}")
    return _finite(obs.astype(np.float32))


def float_array_to_obs(msg, obs_dim: int) -> np.ndarray:
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
                   label=info.label, pinned=info.pinned, nbytes=info.nbytes)


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


def safe_relative_path(file_name: str) -> str:
    """A capsule file name relative to capsule_dir: no absolute paths, no '..', nothing empty."""
    if not file_name or "\x00" in file_name:
        raise ValueError("file_name must be a non-empty relative path")
    if file_name.startswith(("/", "\\", "~")):
        raise ValueError(f"file_name must be relative to capsule_dir, got absolute {file_name!r}")
    parts = file_name.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        raise ValueError(f"file_name must not contain '..': {file_name!r}")
    return "/".join(p for p in parts if p not in ("", "."))
