"""The expert's demonstrations as rosbag2 bags, one episode each, for flashrt-train (rosbags; no ROS graph).

Each bag holds, on sim time (the first observation at 0 s, then every 10 ms):
  /observation         std_msgs/msg/Float32MultiArray      what the policy node steps on (OBS_NAMES, obs_dim 21)
  /joint_states        sensor_msgs/msg/JointState          the arm's positions and velocities
  /action_trajectory   trajectory_msgs/msg/JointTrajectory one point: the expert's joint targets
The command is written COMMAND_LAG_NS after its observation (bag time) and carries the observation's stamp, so
flashrt-train pairs them one to one (--obs-topic /observation --action-topic /action_trajectory).
With perturb > 0 the arm executes the expert's targets plus a slowly varying offset (std perturb rad per joint)
while the bag records the expert's own targets: the demonstrations then show how to recover from states the
expert alone never visits, which a cloned policy's small errors lead it into (DART-style noise injection).
With a driver (a policy Session: DAgger) the arm executes the policy's targets and the bag records the expert's
answer to each observation the policy led the arm into.
With faults the bag's /observation is what the faulty sensor of the fault evaluation reads (sim/faults.py, the
episode's seeded faults) while the expert still answers the true state: a policy trained on it learns to hold
its course through a bad reading instead of following it (DART-style, on the sensor instead of the arm).
/joint_states stays true, as the sim node's does with faults:=true.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tools.episodes import new_episode_dirs
from .evaluate import joint_targets
from .expert import PusherExpert
from .faults import FaultySensor, draw_faults
from .world import ARM_JOINTS, CONTROL_HZ, PusherWorld

OBS_TOPIC = "/observation"
JOINT_STATE_TOPIC = "/joint_states"
COMMAND_TOPIC = "/action_trajectory"
COMMAND_LAG_NS = 1_000_000  # the expert answers 1 ms after its observation, well inside one period
HOLD_AFTER_SUCCESS_S = 0.5  # the episode goes on this long once the object is in, so the bags show it resting
F32, JS, JT = "std_msgs/msg/Float32MultiArray", "sensor_msgs/msg/JointState", "trajectory_msgs/msg/JointTrajectory"
# held-out episodes (success rate) use seeds at and past 2**32; recordings stay below, so the two never meet
HELD_OUT_SEED_BASE = 2 ** 32
PERTURB_MEMORY = 0.95  # the offset's correlation from one step to the next: a drift over ~0.2 s, not jitter


def recording_seed(seed: int, episode: int) -> int:
    """Seed of a recorded episode: below HELD_OUT_SEED_BASE for any --seed and --episodes the CLI takes."""
    if not 0 <= seed < 10_000 or not 0 <= episode < 100_000:
        raise ValueError(f"--seed must be in [0, 10000) and --episodes at most 100000, got {seed}, {episode}")
    return seed * 100_000 + episode


@dataclass
class Recorded:
    path: Path
    seed: int
    steps: int
    success: bool


class _Messages:
    """Builds the three messages of a step from rosbags' Humble types."""

    def __init__(self, ts):
        self.ts, T = ts, ts.types
        self.T = T
        self.layout = T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        self.zero = T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0)

    def header(self, ns: int):
        T = self.T
        return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                        frame_id="")

    def observation(self, obs) -> bytes:
        return self.ts.serialize_cdr(self.T[F32](layout=self.layout, data=np.asarray(obs, np.float32)), F32)

    def joint_state(self, ns: int, q, dq) -> bytes:
        msg = self.T[JS](header=self.header(ns), name=list(ARM_JOINTS), position=np.asarray(q, np.float64),
                         velocity=np.asarray(dq, np.float64), effort=np.zeros(0))
        return self.ts.serialize_cdr(msg, JS)

    def command(self, ns: int, targets) -> bytes:
        T, empty = self.T, np.zeros(0)
        point = T["trajectory_msgs/msg/JointTrajectoryPoint"](positions=np.asarray(targets, np.float64),
                                                              velocities=empty, accelerations=empty, effort=empty,
                                                              time_from_start=self.zero)
        return self.ts.serialize_cdr(T[JT](header=self.header(ns), joint_names=list(ARM_JOINTS), points=[point]), JT)


def record_episode(path: str | Path, world: PusherWorld, expert, seed: int, seconds: float,
                   storage: str = "mcap", perturb: float = 0.0, driver=None, faults: bool = False) -> Recorded:
    """One episode from reset(seed) into a new bag at path; ends HOLD_AFTER_SUCCESS_S after success or at seconds.
    perturb: std (rad) of the offset added to what the arm executes, never to what is recorded. driver: a Session
    on a policy file whose targets the arm executes instead of the expert's (from a fresh state each episode).
    faults: the recorded (and a driver's) observation is the faulty sensor's reading of draw_faults(seed)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    m = _Messages(ts)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    obs = world.reset(seed)
    if driver is not None:
        driver.reset()
    steps, succeeded_at = int(round(seconds * CONTROL_HZ)), None
    rng, offset = np.random.default_rng([seed, 1]), np.zeros(len(ARM_JOINTS))
    sensor = FaultySensor(draw_faults(seed, steps) if faults else [])
    with Writer(Path(path), version=8, storage_plugin=plugin) as w:  # version 8: Humble reads its metadata
        c_obs = w.add_connection(OBS_TOPIC, F32, typestore=ts)
        c_js = w.add_connection(JOINT_STATE_TOPIC, JS, typestore=ts)
        c_cmd = w.add_connection(COMMAND_TOPIC, JT, typestore=ts)
        for step in range(steps):
            ns = world.time_ns
            targets = expert(obs)  # the true state, whatever the sensor reads
            read = sensor.read(step + 1, obs)  # the faults' steps are 1-based, as in the evaluation
            w.write(c_obs, ns, m.observation(read))
            w.write(c_js, ns, m.joint_state(ns, world.joint_positions(), world.joint_velocities()))
            w.write(c_cmd, ns + COMMAND_LAG_NS, m.command(ns, targets))
            if perturb > 0:
                fresh = rng.normal(0.0, perturb * np.sqrt(1 - PERTURB_MEMORY ** 2), len(ARM_JOINTS))
                offset = PERTURB_MEMORY * offset + fresh
            executed = targets if driver is None else joint_targets(driver, driver.step(read).chunk)
            obs = world.step(executed + offset)
            if succeeded_at is None and world.success():
                succeeded_at = step
            if succeeded_at is not None and step - succeeded_at >= HOLD_AFTER_SUCCESS_S * CONTROL_HZ:
                break
    return Recorded(Path(path), seed, step + 1, succeeded_at is not None)


def record_episodes(out_dir: str | Path, episodes: int, seed: int = 0, seconds: float = 10.0,
                    storage: str = "mcap", world: PusherWorld | None = None, expert=None,
                    perturb: float = 0.0, driver=None, faults: bool = False) -> list[Recorded]:
    """episodes bags, episode_000 ... in out_dir (created; refused if it already holds one of them)."""
    if not perturb >= 0:
        raise ValueError(f"--perturb must be >= 0, got {perturb}")
    paths = new_episode_dirs(out_dir, episodes, seconds)
    seeds = [recording_seed(seed, i) for i in range(episodes)]
    world = world or PusherWorld()
    expert = expert or PusherExpert(world)
    return [record_episode(p, world, expert, s, seconds, storage, perturb, driver, faults)
            for p, s in zip(paths, seeds)]
