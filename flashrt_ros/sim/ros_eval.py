"""A policy file's success rate through ROS: per episode, a fresh flashrt node (policy_path, the launch file's
wiring) and a fresh flashrt-sim on that episode's seed, as two processes on this machine's graph.

The policy node starts first and is active before the sim exists, so it steps from the sim's first observations.
An observer in this process follows /clock, the observation and policy_step: the episode succeeds when an
observation within `seconds` of sim time from the policy's first step has the object within the success radius of
the goal (from the observation's float32
object and goal channels; the offline evaluation reads the same positions in float64). The sim runs in real time,
so an episode takes its sim seconds of wall time, plus the two processes' start (a few seconds).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .world import ARM_JOINTS, OBS_NAMES, WorldConfig

# the launch file's wiring of the policy node to the arm (launch/flashrt_sim.launch.py POLICY_OVERRIDES; a test
# holds the two equal), plus a small capsule budget: an episode needs no rollback depth
POLICY_OVERRIDES = {"observation_type": "float32_array", "obs_dim": 21, "action_dim": 7, "publish_trajectory": True,
                    "action_joint_names": list(ARM_JOINTS), "control_period_s": 0.01, "use_sim_time": True}
EVAL_PARAMS = {"capsule_budget_mb": 16.0, "max_branches": 1, "observation_reliable": True}
OBJECT_XY = [OBS_NAMES.index("object.x"), OBS_NAMES.index("object.y")]
GOAL_XY = [OBS_NAMES.index("goal.x"), OBS_NAMES.index("goal.y")]
START_TIMEOUT_S = 60.0  # a cold node start compiles nothing (make setup fills the cache), but the machine may be busy


@dataclass(frozen=True)
class RosEpisode:
    seed: int
    success: bool
    sim_seconds: float  # sim time from the policy's first step to the observation that ended the episode
    policy_steps: int  # PolicyStep messages seen: the policy stepped on the sim's observations


def policy_params_file(policy_path: str, directory: Path) -> Path:
    params = {**POLICY_OVERRIDES, **EVAL_PARAMS, "policy_path": str(Path(policy_path).resolve())}
    path = directory / "policy_params.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


def _script(name: str) -> str:
    return str(Path(sys.executable).parent / name)  # the console scripts beside this interpreter (the venv's)


class _Observer:
    def __init__(self, node, namespace: str):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from std_msgs.msg import Float32MultiArray

        from flashrt_interfaces.msg import PolicyStep

        from ..ros.io.step_link import policy_step_qos

        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.node, self.clock_ns, self.observations, self.steps = node, 0, [], 0
        self.first_step_ns: int | None = None
        self.subscriptions = [
            node.create_subscription(Clock, "/clock", self._on_clock, reliable),
            node.create_subscription(Float32MultiArray, f"/{namespace}/observation", self._on_obs, reliable),
            node.create_subscription(PolicyStep, f"/{namespace}/policy_step", self._on_step, policy_step_qos(100))]

    def close(self) -> None:
        for sub in self.subscriptions:
            self.node.destroy_subscription(sub)

    def _on_clock(self, msg) -> None:
        self.clock_ns = msg.clock.sec * 10**9 + msg.clock.nanosec

    def _on_obs(self, msg) -> None:
        self.observations.append((self.clock_ns, np.asarray(msg.data, np.float32)))

    def _on_step(self, msg) -> None:
        if self.first_step_ns is None:
            self.first_step_ns = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
        self.steps += 1


def _stop(procs) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_ros_episode(node, policy_path: str, seed: int, seconds: float, workdir: Path, radius: float,
                    namespace: str) -> RosEpisode:
    import rclpy

    obs_seen = _Observer(node, namespace)
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}  # ROS processes stay on this machine
    ns = ["-r", f"__ns:=/{namespace}"]
    params = policy_params_file(policy_path, workdir)
    procs = []
    with open(workdir / f"{namespace}.log", "w") as log:
        try:
            procs.append(subprocess.Popen([_script("flashrt_node"), "--ros-args", *ns, "--params-file", str(params)],
                                          env=env, stdout=log, stderr=subprocess.STDOUT))
            # the node subscribes to its observation on activate: from then on it steps on every one
            _wait_for(node, lambda: node.count_subscribers(f"/{namespace}/observation") > 0, procs, log)
            procs.append(subprocess.Popen([_script("flashrt-sim"), "--ros-args", *ns, "-p", f"seed:={seed}"],
                                          env=env, stdout=log, stderr=subprocess.STDOUT))
            # the episode's clock starts at the policy's first step: DDS discovery may take a moment under load,
            # and until the node answers, the arm holds its reset pose (the object rests where reset put it)
            _wait_for(node, lambda: obs_seen.first_step_ns is not None, procs, log)
            end_ns, success, at_ns = obs_seen.first_step_ns + int(seconds * 1e9), False, 0
            deadline = time.monotonic() + START_TIMEOUT_S + 3 * seconds
            while not success and at_ns < end_ns and time.monotonic() < deadline:
                rclpy.spin_once(node, timeout_sec=0.05)
                _check_alive(procs, log)
                for at_ns, obs in obs_seen.observations:
                    if at_ns <= end_ns and np.linalg.norm(obs[OBJECT_XY] - obs[GOAL_XY]) <= radius:
                        success = True
                        break
                obs_seen.observations.clear()
            if not success and at_ns < end_ns:
                raise TimeoutError(f"episode {seed}: the sim reached {at_ns / 1e9:.2f} s of {end_ns / 1e9:.2f} s "
                                   "in time")
            seconds_run = min(at_ns, end_ns) - obs_seen.first_step_ns
        finally:
            _stop(procs)
            obs_seen.close()
    return RosEpisode(seed, success, seconds_run / 1e9, obs_seen.steps)


def _check_alive(procs, log) -> None:
    for proc in procs:
        if proc.poll() is not None:
            log.flush()
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: {Path(log.name).read_text()[-2000:]}")


def _wait_for(node, ready, procs, log) -> None:
    import rclpy

    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            log.flush()
            raise TimeoutError(f"the policy node did not start stepping in {START_TIMEOUT_S:.0f} s: "
                               f"{Path(log.name).read_text()[-2000:]}")
        _check_alive(procs, log)
        rclpy.spin_once(node, timeout_sec=0.1)


def ros_success(policy_path: str, seeds, seconds: float = 10.0, on_episode=None) -> list[RosEpisode]:
    """The episodes of seeds through ROS, one after another; on_episode(RosEpisode) after each."""
    import rclpy

    radius = WorldConfig().success_radius
    owns_rclpy = not rclpy.ok()  # a caller's context (a test's domain) is used, not replaced
    if owns_rclpy:
        rclpy.init()
    node = rclpy.create_node("flashrt_sim_eval")
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="flashrt-sim-eval-") as tmp:
            for i, seed in enumerate(seeds):
                # a namespace per episode: a late message of the last episode's processes reaches no one
                results.append(run_ros_episode(node, policy_path, seed, seconds, Path(tmp), radius, f"eval{i}"))
                if on_episode is not None:
                    on_episode(results[-1])
    finally:
        node.destroy_node()
        if owns_rclpy:
            rclpy.try_shutdown()
    return results
