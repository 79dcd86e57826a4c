"""Node parameters: every PolicyConfig field plus the node's own, each with a description.

Every parameter is declared with dynamic typing, so a value of the wrong type never ends in an rclpy
traceback at declaration: the values are checked here, by name, when the node configures (and for the
few live parameters, when they are set), giving a one-line error that names the parameter. An integer
for a float parameter (``capsule_budget_mb: 512``) is accepted.

Sizes and the node's structural parameters are declared ``read_only``: they are read once, from the
params file or ``-p`` at start-up, and ``ros2 param describe`` says so. Changing one means restarting
the node. Only the deadlines can be set while the node runs.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.parameter import Parameter

from ..runtime.config import PolicyConfig


def default_capsule_dir() -> str:
    """$ROS_HOME/flashrt_capsules, ROS_HOME defaulting to ~/.ros (where ROS keeps its own state):
    exports survive a reboot, unlike /tmp."""
    ros_home = os.environ.get("ROS_HOME") or str(Path("~/.ros").expanduser())
    return str(Path(ros_home) / "flashrt_capsules")


def _positive_number(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: must be a positive finite number, got {v!r}")
    return float(v)


def _string(name: str, v, choices: tuple[str, ...] = ()) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name}: expected a string, got {v!r}")
    if choices and v not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {v!r}")
    return v


def _bool(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name}: expected true or false, got {v!r}")
    return v


def _joint_names(name: str, v) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, (list, tuple)) or not all(isinstance(j, str) and j for j in v):
        raise ValueError(f"{name}: expected a list of non-empty strings, got {v!r}")
    if len(set(v)) != len(v):
        dup = sorted({j for j in v if list(v).count(j) > 1})
        raise ValueError(f"{name}: duplicate joint names {dup}")
    return list(v)


def _non_negative(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
    return float(v)


def _count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name}: must be an integer >= 0, got {v!r}")
    return v


def _capsule_dir(name: str, v) -> str:
    v = _string(name, v)
    if not v.strip():
        raise ValueError(f"{name}: must not be empty (an empty directory would mean the working directory)")
    return v


# name: (default, description, validator, changeable at runtime)
NODE_PARAMS = {
    "backend": ("auto", "auto | numpy | cuda: 'auto' takes CUDA when CuPy has a usable device",
                lambda n, v: _string(n, v, ("auto", "numpy", "cuda")), False),
    "observation_type": ("joint_state", "joint_state (sensor_msgs/JointState) | float32_array "
                         "(std_msgs/Float32MultiArray)",
                         lambda n, v: _string(n, v, ("joint_state", "float32_array")), False),
    "joint_names": (None, "order in which JointState positions, then velocities, fill the observation. "
                    "Unset: the names of the first accepted message, enforced from then on", _joint_names, False),
    "observation_reliable": (False, "reliable QoS on 'observation' (lossless replay); false = sensor-data "
                             "(best effort). Depth 4 either way, as during a replan: the 4 newest wait, the "
                             "oldest is dropped first",
                             _bool, False),
    "replan_deadline_ms": (50.0, "default Replan deadline when a goal says 0 (positive, finite)",
                           _positive_number, True),
    "replan_max_deadline_ms": (200.0, "longest deadline a Replan goal may ask for; a goal over it is rejected "
                               "(one replan runs at a time, so this bounds how long a goal occupies it)",
                               _positive_number, True),
    "step_deadline_ms": (10.0, "a step slower than this is counted and warned about (positive, finite)",
                         _positive_number, True),
    "capsule_dir": (default_capsule_dir(), "directory of export_capsule / import_capsule files (created "
                    "with mode 0700; refused if another user owns it). Default $ROS_HOME/flashrt_capsules, "
                    "ROS_HOME defaulting to ~/.ros", _capsule_dir, False),
    "diagnostics_period_s": (1.0, "period of /diagnostics (published in every lifecycle state)",
                             _positive_number, False),
    "autostart": (True, "configure and activate on start-up, without a lifecycle manager", _bool, False),
    # persistence (crash-resume): runtime/persist.py
    "persist_dir": ("", "directory of the capsule log: every timeline capsule is appended there, off the step's "
                    "path; empty = no persistence", lambda n, v: _string(n, v), False),
    "resume": (False, "on configure, rebuild the capsules from the log in persist_dir and continue from the newest "
               "one, byte-exactly (needs persist_dir)", _bool, False),
    "resume_fresh_on_mismatch": (False, "when the log in persist_dir was written by another config, weights or "
                                 "plan: false = configure fails and says so; true = move the log aside "
                                 "(persist_dir/stale-<time>/) and start fresh", _bool, False),
    "persist_fsync_ms": (100.0, "fsync the log at least this often, in ms (0 = no time trigger); a kill -9 "
                         "loses only what is still queued, a power cut what is not fsynced yet",
                         _non_negative, False),
    "persist_fsync_records": (0, "also fsync after this many records (0 = no count trigger)", _count, False),
    "persist_segment_mb": (64.0, "segment file size; each segment starts with a whole-window record, so it is "
                           "raised at configure to hold at least 4 of them",
                           _positive_number, False),
    "persist_budget_mb": (2048.0, "disk budget of the log (segments and pin files): the oldest segments are "
                          "removed first, a pinned capsule's file never (a pin that would not fit beside two "
                          "segments is refused); at least two segments", _positive_number, False),
    "persist_queue_mb": (64.0, "records waiting for the disk; past it records are dropped (counted in "
                         "/diagnostics) and the next one written is a whole-window resync point; raised at "
                         "configure to hold at least 3 whole-window records",
                         _non_negative, False),
}
LIVE_PARAMS = {n for n, (_, _, _, live) in NODE_PARAMS.items() if live}
READ_ONLY_NOTE = " [read-only: set at start-up (params file or -p); restart the node to change it]"


def command_line_overrides(argv, node_name: str) -> dict:
    """``-p name:=value`` of the ROS arguments, typed as rcl types them (YAML). Needed because when a
    params file and ``-p`` give one parameter values of different types (``kv_window: 1024`` in the
    file, ``-p kv_window:=abc``), rcl keeps both and rclpy silently returns the file's: the ``-p``
    value, which must win, would be lost without a word."""
    import yaml

    out, in_ros_args, it = {}, False, iter(argv or ())
    for arg in it:
        if arg == "--ros-args":
            in_ros_args = True
        elif arg == "--":
            in_ros_args = False
        elif in_ros_args and arg in ("-p", "--param"):
            name, sep, text = next(it, "").partition(":=")
            if not sep:
                continue
            prefix, _, name = name.rpartition(":")
            if prefix and prefix.strip("/").split("/")[-1] != node_name:
                continue  # meant for another node
            try:
                out[name] = yaml.safe_load(text) if text else ""
            except yaml.YAMLError:
                out[name] = text
    return out


def declare_all(node, overrides: dict | None = None) -> None:
    """``overrides``: command_line_overrides(); those values are declared as given (see there)."""
    overrides = overrides or {}

    def declare(name, default, descriptor):
        if name in overrides:
            node.declare_parameter(name, overrides[name], descriptor, ignore_override=True)
        else:
            node.declare_parameter(name, default, descriptor)

    for f in dataclasses.fields(PolicyConfig):
        declare(f.name, f.default, ParameterDescriptor(
            description=f.metadata["help"] + READ_ONLY_NOTE, read_only=True, dynamic_typing=True))
    for name, (default, help_text, _, live) in NODE_PARAMS.items():
        declare(name, default, ParameterDescriptor(
            description=help_text + ("" if live else READ_ONLY_NOTE), read_only=not live, dynamic_typing=True))


def check_node_param(name: str, value):
    """The one validation of a node parameter, at configure and when it is set at runtime."""
    return NODE_PARAMS[name][2](name, value)


def read_config(node) -> tuple[PolicyConfig, dict]:
    """PolicyConfig and the node's own parameters; ValueError naming the parameter."""
    values = {f.name: _value(node, f.name) for f in dataclasses.fields(PolicyConfig)}
    cfg = PolicyConfig(**values)  # checks types and ranges field by field, naming the field
    own = {n: check_node_param(n, _value(node, n)) for n in NODE_PARAMS}
    return cfg, own


def _value(node, name: str):
    p = node.get_parameter(name)
    return None if p.type_ == Parameter.Type.NOT_SET else p.value


def guard_live_params(node) -> None:
    """Read-only parameters are refused by rclpy itself; the live ones get the configure-time check."""

    def check(params):
        for p in params:
            if p.name in LIVE_PARAMS:
                try:
                    check_node_param(p.name, None if p.type_ == Parameter.Type.NOT_SET else p.value)
                except ValueError as e:
                    return SetParametersResult(successful=False, reason=str(e))
        return SetParametersResult(successful=True)

    node.add_on_set_parameters_callback(check)
