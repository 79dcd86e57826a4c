"""A scripted expert on a simulated 7-joint arm, recorded as rosbag2 bags: demonstrations for flashrt-train until
the MuJoCo arm exists. NumPy and rosbags only (no torch, no ROS).

The arm: each joint a unit mass behind a PD position controller (second order: the commanded target pulls the
joint, velocity damps it), integrated at 100 Hz (semi-implicit Euler, 10 substeps). The expert: every few
seconds a new goal per joint (uniform in +-goal_range rad, so targets past 1 rad occur); each step it commands a
target that moves toward the goal at most max_step rad ahead of the joint (a rate-limited reach, nonlinear in
the observation). A small perturbation is added to what is executed, never to what is recorded, so the bags visit
states off the expert's own path (DART-style) and the policy learns to recover from them.

Topics of each bag (one episode):
  /observation    std_msgs/msg/Float64MultiArray   [q (7), dq (7), goal (7)]: what the expert needs, obs_dim 21
  /joint_command  sensor_msgs/msg/JointState        position = the commanded target (7), names joint0..joint6,
                  (or trajectory_msgs/msg/JointTrajectory, one point, with action_type="trajectory")
The command is written `latency_ms` after its observation (bag time) and carries the observation's header stamp.

    python -m flashrt_ros.train.expert DIR --episodes N [--seconds 10] [--seed 0]
    flashrt-train --make-expert-bags DIR --episodes N
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tools.episodes import new_episode_dirs

OBS_TOPIC = "/observation"
ACTION_TOPIC = "/joint_command"
JOINTS = 7
T0_NS = 1_700_000_000_000_000_000


@dataclass(frozen=True)
class ArmExpert:
    joints: int = JOINTS
    rate_hz: float = 100.0
    kp: float = 100.0  # PD gains of the joint controller: critically damped at 10 rad/s
    kd: float = 20.0
    goal_range: float = 1.5  # rad: goals beyond 1 rad, out of tanh's reach without action_scale
    goal_every_s: float = 2.5
    max_step: float = 0.25  # rad the command may lead the joint by
    perturb: float = 0.02  # rad, std of the executed (unrecorded) perturbation

    def command(self, q: np.ndarray, goal: np.ndarray) -> np.ndarray:
        return q + np.clip(goal - q, -self.max_step, self.max_step)

    def episode(self, seconds: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(obs [n, 3 * joints], commands [n, joints]) of one episode."""
        rng = np.random.default_rng(seed)
        n = int(round(seconds * self.rate_hz))
        dt, sub = 1.0 / self.rate_hz, 10
        q = rng.uniform(-0.5, 0.5, self.joints)
        dq = np.zeros(self.joints)
        goal = rng.uniform(-self.goal_range, self.goal_range, self.joints)
        every = max(1, int(round(self.goal_every_s * self.rate_hz)))
        obs = np.empty((n, 3 * self.joints))
        act = np.empty((n, self.joints))
        for t in range(n):
            if t and t % every == 0:
                goal = rng.uniform(-self.goal_range, self.goal_range, self.joints)
            obs[t] = np.concatenate([q, dq, goal])
            act[t] = u = self.command(q, goal)
            u = u + self.perturb * rng.standard_normal(self.joints)
            for _ in range(sub):
                dq = dq + (self.kp * (u - q) - self.kd * dq) * (dt / sub)
                q = q + dq * (dt / sub)
        return obs, act


def joint_names(joints: int = JOINTS) -> list[str]:
    return [f"joint{i}" for i in range(joints)]


def obs_names(joints: int = JOINTS) -> list[str]:
    j = joint_names(joints)
    return [f"{n}.position" for n in j] + [f"{n}.velocity" for n in j] + [f"{n}.goal" for n in j]


def write_episode_bag(path: str | Path, obs: np.ndarray, act: np.ndarray, rate_hz: float = 100.0,
                      action_type: str = "joint_state", latency_ms: float = 2.0, storage: str = "mcap",
                      obs_topic: str = OBS_TOPIC, action_topic: str = ACTION_TOPIC) -> Path:
    """One bag: obs [n, d] as Float64MultiArray, act [n, joints] as JointState (or JointTrajectory) commands."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    names = joint_names(act.shape[1])
    period = int(round(1e9 / rate_hz))
    lat = int(round(latency_ms * 1e6))
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    f64, js, jt = "std_msgs/msg/Float64MultiArray", "sensor_msgs/msg/JointState", "trajectory_msgs/msg/JointTrajectory"
    atype = {"joint_state": js, "trajectory": jt, "array": f64}[action_type]
    layout = T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    dur = T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0)
    with Writer(Path(path), version=8, storage_plugin=plugin) as w:
        c_obs = w.add_connection(obs_topic, f64, typestore=ts)
        c_act = w.add_connection(action_topic, atype, typestore=ts)
        for i in range(len(obs)):
            ns = T0_NS + i * period
            header = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9,
                                                                                  nanosec=ns % 10**9), frame_id="")
            w.write(c_obs, ns, ts.serialize_cdr(T[f64](layout=layout, data=np.asarray(obs[i], np.float64)), f64))
            a = np.asarray(act[i], np.float64)
            if atype == js:
                msg = T[js](header=header, name=names, position=a, velocity=np.zeros(0), effort=np.zeros(0))
            elif atype == jt:
                pt = T["trajectory_msgs/msg/JointTrajectoryPoint"](positions=a, velocities=np.zeros(0),
                                                                  accelerations=np.zeros(0), effort=np.zeros(0),
                                                                  time_from_start=dur)
                msg = T[jt](header=header, joint_names=names, points=[pt])
            else:
                msg = T[f64](layout=layout, data=a)
            w.write(c_act, ns + lat, ts.serialize_cdr(msg, atype))
    return Path(path)


def make_expert_bags(out_dir: str | Path, episodes: int, seconds: float = 10.0, seed: int = 0,
                     action_type: str = "joint_state", expert: ArmExpert | None = None) -> list[Path]:
    """episodes bags, episode_000 ... in out_dir (created; refused if it already holds one of them)."""
    paths = new_episode_dirs(out_dir, episodes, seconds)
    expert = expert or ArmExpert()
    for i, p in enumerate(paths):
        obs, act = expert.episode(seconds, seed * 100_003 + i)
        write_episode_bag(p, obs, act, expert.rate_hz, action_type)
    return paths


def main(argv=None) -> int:
    """Exit 0 when the bags are written, 2 on bad arguments or an existing bag."""
    ap = argparse.ArgumentParser(prog="python -m flashrt_ros.train.expert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", help="directory for the bags (episode_000, episode_001, ...)")
    ap.add_argument("--episodes", type=int, default=10, help="bags to write, one episode each (default 10)")
    ap.add_argument("--seconds", type=float, default=10.0, help="episode length at 100 Hz (default 10 s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the goals and perturbations")
    ap.add_argument("--action-type", choices=("joint_state", "trajectory", "array"), default="joint_state",
                    help="message type of the commands on /joint_command (default joint_state)")
    args = ap.parse_args(argv)
    try:
        paths = make_expert_bags(args.out_dir, args.episodes, args.seconds, args.seed, args.action_type)
    except (ValueError, FileExistsError) as e:
        print(f"expert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} bags to {args.out_dir} ({OBS_TOPIC} obs_dim {3 * JOINTS}, {ACTION_TOPIC})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
