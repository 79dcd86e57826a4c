"""Node parameters: every PolicyConfig field plus the node's own, each with a description and, for
numbers, the range the node enforces (in the descriptor, so `ros2 param describe` and rqt show it).

Every parameter is declared with dynamic typing, so a value of the wrong type never ends in an rclpy
traceback at declaration: the values are checked here, by name, when the node configures (and for the
few live parameters, when they are set), giving a one-line error that names the parameter. An integer
for a float parameter (``capsule_budget_mb: 512``, ``ros2 param set ... replan_deadline_ms 30``) is
taken as that float: the parameter stays a double.

Sizes and the node's structural parameters are declared ``read_only``: they are read once, from the
params file or ``-p`` at start-up, and ``ros2 param describe`` says so. Changing one means restarting
the node. Only the deadlines can be set while the node runs, and ``replan_max_deadline_ms`` only up to
its start-up value (its range's maximum): no client can raise the time one goal may hold the only
replan slot. ``replan_deadline_ms`` never exceeds ``replan_max_deadline_ms``, checked whichever is set.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from ..runtime.engine.backend import BACKENDS
from ..runtime.model.config import PolicyConfig
from .io.convert import check_controller_joint_names


def default_capsule_dir() -> str:
    """$ROS_HOME/flashrt_capsules, ROS_HOME defaulting to ~/.ros (where ROS keeps its own state):
    exports survive a reboot, unlike /tmp."""
    ros_home = os.environ.get("ROS_HOME") or str(Path("~/.ros").expanduser())
    return str(Path(ros_home) / "flashrt_capsules")


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
    if name == "action_joint_names":  # what a controller is sent (joint_names keeps the robot's own names)
        check_controller_joint_names(name, v)
    return list(v)


ROLES = ("primary", "replica", "standby")
INT64_MAX = 2**63 - 1
REPLAN_DEADLINE_CEILING_MS = 600_000.0  # 10 min: the most replan_max_deadline_ms may say, even at start-up
# name: (from, to), both inclusive: each numeric node parameter's range, in its descriptor and enforced.
# PolicyConfig fields get theirs from their `min` and `max` (config.py; a float's max is FLOAT32_MAX).
NODE_RANGES = {
    "replan_deadline_ms": (0.001, REPLAN_DEADLINE_CEILING_MS),
    "replan_max_deadline_ms": (0.001, REPLAN_DEADLINE_CEILING_MS),
    "replan_max_goal_mb": (0.001, 4096.0),
    "step_deadline_ms": (0.001, 60_000.0),
    "diagnostics_period_s": (0.01, 3600.0),
    "persist_fsync_ms": (0.0, 3_600_000.0),
    "persist_fsync_records": (0, 2**31 - 1),
    "persist_segment_mb": (0.001, 1_048_576.0),
    "persist_budget_mb": (0.001, 1_073_741_824.0),
    "persist_queue_mb": (0.0, 1_048_576.0),
    "control_period_s": (0.0001, 3600.0),
    "max_future_stamp_ms": (0.0, 3_600_000.0),
    "thread_priority": (0, 99),
    "replan_nice": (0, 19),
    "gc_freeze_period_s": (0.0, 3600.0),
    "stream_keyframe_s": (0.1, 3600.0),
    "liveliness_lease_ms": (10.0, 60_000.0),
    "standby_takeover_delay_ms": (0.0, 10_000.0),  # a standby holds 2000 observations: 20 s at 100 Hz
}


def number_in(name: str, v, lo, hi):
    """v as the type of the range (an int is taken for a float), inside [lo, hi]; ValueError naming name."""
    if isinstance(lo, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: expected a finite number in [{lo:g}, {hi:g}], got {v!r}")
        v = float(v)
    elif isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{name}: must be in [{lo:g}, {hi:g}], got {v!r}")
    return v


def _ranged(name: str, v):
    lo, hi = NODE_RANGES[name]
    return number_in(name, v, lo, hi)


def _capsule_dir(name: str, v) -> str:
    v = _string(name, v)
    if not v.strip():
        raise ValueError(f"{name}: must not be empty (an empty directory would mean the working directory)")
    return v


# name: (default, description, validator, changeable at runtime)
NODE_PARAMS = {
    "backend": ("auto", "auto | cpu | numpy | cuda: 'auto' takes CUDA when CuPy has a usable device, else the "
                "compiled CPU step (numba), else NumPy (the reference)",
                lambda n, v: _string(n, v, BACKENDS), False),
    "observation_type": ("joint_state", "joint_state (sensor_msgs/JointState) | float32_array "
                         "(std_msgs/Float32MultiArray)",
                         lambda n, v: _string(n, v, ("joint_state", "float32_array")), False),
    "joint_names": (None, "order in which JointState positions, then velocities, fill the observation, "
                    "taken by name; a message lacking one of them is refused (an ERROR on /diagnostics). "
                    "Unset: message order, names unchecked", _joint_names, False),
    "observation_reliable": (False, "reliable QoS on 'observation' (lossless replay); false = sensor-data "
                             "(best effort). Depth 8 either way (qos_overrides can change it): an executor that "
                             "falls behind for a few sensor periods still steps each one; past that the oldest "
                             "is dropped first",
                             _bool, False),
    "replan_deadline_ms": (50.0, "default Replan deadline when a goal says 0; at most replan_max_deadline_ms",
                           _ranged, True),
    "replan_max_deadline_ms": (200.0, "longest deadline a Replan goal may ask for; a goal over it is rejected "
                               "(one replan runs at a time, so this bounds how long a goal occupies it). Can be "
                               "lowered while the node runs, never raised above its start-up value (the range's "
                               f"maximum; at most {REPLAN_DEADLINE_CEILING_MS:g} ms)", _ranged, True),
    "replan_max_goal_mb": (16.0, "largest Replan goal: branches x horizon x obs_dim x 4 bytes of observations; "
                           "a larger goal is rejected before it is converted (it would cost memory and a "
                           "control-loop gap). rclpy has built the goal message by then (it hands no raw goal to "
                           "Python): a goal near the DDS limit still costs its size in memory while it is refused",
                           _ranged, False),
    "step_deadline_ms": (10.0, "a step slower than this is counted and warned about", _ranged, True),
    "capsule_dir": (default_capsule_dir(), "directory of export_capsule / import_capsule files (created "
                    "with mode 0700; refused if another user owns it). Default $ROS_HOME/flashrt_capsules, "
                    "ROS_HOME defaulting to ~/.ros", _capsule_dir, False),
    "capsule_hmac_key_file": ("", "path of a key file (at least 16 bytes, mode 0600, e.g. openssl rand -hex 32): "
                              "exports carry an HMAC-SHA256 of this key and imports without it, or with another, "
                              "are refused; leader claims and capsule stream records are signed with it too, and "
                              "those of other nodes without its HMAC refused (give a robot's nodes one key). The key "
                              "itself is never a parameter value. Empty = no HMAC",
                              lambda n, v: _string(n, v), False),
    "diagnostics_period_s": (1.0, "period of /diagnostics (published in every lifecycle state)",
                             _ranged, False),
    "autostart": (True, "configure and activate on start-up, without a lifecycle manager", _bool, False),
    # persistence (crash-resume): runtime/persist/writer.py
    "persist_dir": ("", "directory of the capsule log: every timeline capsule is appended there, off the step's "
                    "path; empty = no persistence", lambda n, v: _string(n, v), False),
    "resume": (False, "on configure, rebuild the capsules from the log in persist_dir and continue from the newest "
               "one, byte-exactly (needs persist_dir)", _bool, False),
    "resume_fresh_on_mismatch": (False, "when the log in persist_dir was written by another config, weights or "
                                 "plan: false = configure fails and says so; true = move the log aside "
                                 "(persist_dir/stale-<time>/) and start fresh", _bool, False),
    "persist_fsync_ms": (100.0, "fsync the log at least this often, in ms (0 = no time trigger); a kill -9 "
                         "loses only what is still queued, a power cut what is not fsynced yet",
                         _ranged, False),
    "persist_fsync_records": (0, "also fsync after this many records (0 = no count trigger)", _ranged, False),
    "persist_segment_mb": (64.0, "segment file size; each segment starts with a whole-window record, so it is "
                           "raised at configure to hold at least 4 of them",
                           _ranged, False),
    "persist_budget_mb": (2048.0, "disk budget of the log (segments and pin files): the oldest segments are "
                          "removed first, a pinned capsule's file never (a pin that would not fit beside two "
                          "segments is refused); at least two segments", _ranged, False),
    "persist_queue_mb": (64.0, "records waiting for the disk; past it records are dropped (counted in "
                         "/diagnostics) and the next one written is a whole-window resync point; raised at "
                         "configure to hold at least 3 whole-window records",
                         _ranged, False),
    # output for ros2_control (io/outputs.py); QoS overrides: io/qos.py
    "publish_trajectory": (False, "also publish the action chunk as trajectory_msgs/JointTrajectory on "
                           "'action_trajectory' (for joint_trajectory_controller): point k = chunk[k] as positions "
                           "(in action units, not blended), finite-difference velocities, at time_from_start "
                           "(k+1) * control_period_s; header.stamp zero: the controller starts it on arrival",
                           _bool, False),
    "action_joint_names": (None, "names of the action's values, in the policy's output order (one per action_dim): "
                           "the JointTrajectory's joint_names; ASCII letters, digits and underscores, not starting "
                           "with a digit. Unset: action_0 .. action_<action_dim-1> (a controller will not match "
                           "them: set this)", _joint_names, False),
    "control_period_s": (0.01, "time between two actions of the chunk, in s (> 0; 0.01 = 100 Hz): the spacing "
                         "of the JointTrajectory's time_from_start", _ranged, False),
    "max_future_stamp_ms": (500.0, "an observation stamped more than this ahead of the node's clock is refused, "
                            "its state untouched, and counted (stamps_in_future on /diagnostics): a stamp years "
                            "ahead would go into the step's capsule, policy_step and history. Covers the clock "
                            "offset between the sensor's computer and this one", _ranged, False),
    # real-time scheduling (platform/realtime.py), as ros2_control's controller_manager offers it
    "thread_priority": (0, "SCHED_FIFO priority (1..99) of the thread that steps observations; 0 = normal "
                        "scheduling. Needs CAP_SYS_NICE or an rtprio limit (ulimit -r); where it is not allowed "
                        "the node says so in one warning and runs on normally. The replan worker is unchanged",
                        _ranged, False),
    "replan_nice": (0, "nice value (1..19) the replan worker and the threads it splits a replan over "
                    "(replan_threads) run at, at least: higher lets the stepping thread, DDS and the robot's other "
                    "processes take the cores first, so a replan takes longer when they are busy. Needs no "
                    "privilege; only ever raised while the node runs (restart it to lower it). 0 = leave it",
                    _ranged, False),
    # the capsule stream and replicas (group/stream.py, group/replica.py)
    "role": ("primary", "primary | replica | standby. A primary steps observations and publishes every capsule "
             "record on ~/capsule_stream; a replica steps nothing: it rebuilds the primary's capsule store from that "
             "stream and serves list_capsules, export_capsule and what-if replan goals from it, off the robot; a "
             "standby is a replica that also hears the primary's observations and takes over stepping and "
             "publishing (on the primary's topics) when the primary's process stops",
             lambda n, v: _string(n, v, ROLES), False),
    "primary": ("", "role replica or standby: the primary node's fully qualified name (/robot1/flashrt), or its "
                "namespace alone (/robot1) for a node named flashrt. A standby steps and publishes on that "
                "namespace's observation, action and policy_step", lambda n, v: _string(n, v), False),
    "liveliness_lease_ms": (100.0, "the capsule stream's liveliness lease, in ms: a primary offers it, a standby "
                            "asks for it and takes over about 1.5 leases after the primary's process stops (5 when "
                            "the primary had no observation to step). "
                            "Give every node that may lead the robot (the primary, each standby) the same value (a "
                            "standby asking for less than a leader offers receives nothing from it)", _ranged, False),
    "standby_takeover_delay_ms": (0.0, "role standby: how much longer than liveliness_lease_ms's rule this standby "
                                  "waits before taking over (0..10000). Give every standby of one robot after the "
                                  "first its own delay, 1500 apart or more (Fast DDS's 1 s shared-memory health check "
                                  "+ 0.5 s: the first's claim can wait that long after a kill -9): the first takes "
                                  "over and claims the robot, the others follow the new leader (and take over when "
                                  "it stops) instead of taking over beside it (two that judge together both take "
                                  "over, and the later claim is deposed). A takeover then steps the delay's held "
                                  "observations in one burst", _ranged, False),
    "capsule_stream": (True, "publish every capsule record on ~/capsule_stream (reliable, off the step's thread) "
                       "for replicas and bags, and serve ~/capsule_stream/resync", _bool, False),
    "gc_freeze_period_s": (5.0, "every this many seconds, Python's garbage collector collects what is new and "
                           "freezes what survives (gc.freeze), so it never walks the capsule index and history "
                           "again: a full collection of a full store held the GIL 45-85 ms, stopping the step and "
                           "the capsule stream; 0 = CPython's default collector", _ranged, False),
    "keep_freed_memory": (True, "at start, glibc keeps freed heap memory mapped (blocks under 32 MiB from the heap, "
                          "up to 64 MiB kept per arena) so the capsule stream's 4 MiB keyframes reuse pages instead "
                          "of faulting in new ones (that held the records behind each keyframe 20-60 ms); false = "
                          "the C library's defaults", _bool, False),
    "clean_dead_shm_segments": (True, "at start, remove the Fast DDS shared-memory segments in /dev/shm that no "
                                "living process holds (kill -9 and crashes leave them, each keeping up to 16 MiB "
                                "of RAM with the shipped DDS profile); only ones older than 60 s, never a live "
                                "process's", _bool, False),
    "use_shipped_dds_profile": (True, "at start, unless FASTDDS_DEFAULT_PROFILES_FILE is set, Fast DDS reads the "
                                "shipped config/fastdds.xml (a 16 MiB shared-memory segment: a capsule stream "
                                "keyframe reaches a replica in ~9 ms instead of ~50 ms in 512 KiB pieces); false = "
                                "the RMW's defaults. Read before the node exists: set it with -p or a params file",
                                _bool, False),
    "hold_dead_participant_ids": (True, "at start, keep Fast DDS off the participant ids of processes that died "
                                  "(kill -9): a restarted node on a dead one's shared-memory port could hear nothing "
                                  "for a minute; false = whatever id Fast DDS gives. Read before the node exists: "
                                  "set it with -p or a params file", _bool, False),
    "thread_safe_action_client": (True, "a replica forwards its committing replans through an rclpy action client "
                                  "made safe for a node spun on another thread (rclpy issue 1123: a goal response "
                                  "taken before its future was registered was dropped); false = rclpy's own", _bool,
                                  False),
    "stream_keyframe_s": (10.0, "a whole-window record (RESYNC) goes out on ~/capsule_stream at least this often, "
                          "in s: where a late replica or a bag can start", _ranged, False),
}
LIVE_PARAMS = {n for n, (_, _, _, live) in NODE_PARAMS.items() if live}
FLOAT_PARAMS = ({n for n, (default, *_) in NODE_PARAMS.items() if isinstance(default, float)}
                | {f.name for f in dataclasses.fields(PolicyConfig) if f.type in ("float", float)})
READ_ONLY_NOTE = " [read-only: set at start-up (params file or -p); restart the node to change it]"


def check_node_param(name: str, value):
    """The one validation of a node parameter, at configure and when it is set at runtime."""
    return NODE_PARAMS[name][2](name, value)


def check_deadlines(deadline_ms: float, max_deadline_ms: float) -> None:
    if deadline_ms > max_deadline_ms:
        raise ValueError(f"replan_deadline_ms ({deadline_ms:g}) must not exceed replan_max_deadline_ms "
                         f"({max_deadline_ms:g}): every goal that relies on the default would be refused. Lower "
                         "replan_deadline_ms first, or set both at once")


