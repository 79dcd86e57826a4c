"""launch/flashrt_sim.launch.py closes the loop: the flashrt node steps on flashrt-sim's observations (on sim
time) and its action_trajectory moves the simulated arm."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launch_subset import resolve
from ros_harness import FAST, ROOT, terminate_all

from flashrt_ros.sim.world import ARM_JOINTS

pytestmark = pytest.mark.ros
LAUNCH = ROOT / "launch" / "flashrt_sim.launch.py"


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    nodes = resolve(LAUNCH, {"namespace": "loop", "seed": "5"}, {"flashrt_ros": ROOT})
    bin_dir = Path(sys.executable).parent  # the venv's console scripts
    commands = {}
    for node in nodes:
        if node.executable == "flashrt_node":
            # a quick start; the window is the shipped policy file's (policy_path), not FAST's
            node.parameters.append({k: v for k, v in FAST.items() if k not in ("observation_reliable", "kv_window")})
        commands[node.executable] = node.command(str(bin_dir / node.executable), tmp_path)
    return commands


def test_the_launch_file_starts_the_sim_and_a_policy_wired_to_it(tmp_path):
    nodes = {n.executable: n for n in resolve(LAUNCH, {}, {"flashrt_ros": ROOT})}
    assert set(nodes) == {"flashrt-sim", "flashrt_node"}
    overrides = nodes["flashrt_node"].parameters[-1]
    assert overrides["observation_type"] == "float32_array" and overrides["obs_dim"] == 21
    assert overrides["action_joint_names"] == list(ARM_JOINTS) and overrides["use_sim_time"] is True
    assert nodes["flashrt-sim"].namespace == nodes["flashrt_node"].namespace == "sim"


def test_the_policy_steps_on_the_sims_observations_and_its_trajectory_moves_the_arm(ros_domain, tmp_path):
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState

    from flashrt_interfaces.msg import PolicyStep
    from flashrt_ros.ros.io.step_link import policy_step_qos

    listener = rclpy.create_node("loop_listener")
    steps, joints = [], []
    listener.create_subscription(PolicyStep, "/loop/policy_step", steps.append, policy_step_qos(1000))
    listener.create_subscription(JointState, "/loop/joint_states", joints.append,
                                 QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    procs = []
    try:
        for name, cmd in _commands(tmp_path).items():
            log = open(tmp_path / f"{name}.log", "w")
            procs.append((subprocess.Popen(cmd, env=ros_domain, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log))
        end = time.monotonic() + 60
        while time.monotonic() < end and not (len(steps) >= 50 and len(joints) >= 50):
            rclpy.spin_once(listener, timeout_sec=0.05)
        logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
        assert len(steps) >= 50, logs
        first = np.array(joints[0].position)
        moved = max(np.abs(np.array(j.position) - first).max() for j in joints)
        assert moved > 0.05, logs  # held at its reset pose, the arm stays within 0.005 rad
        sim_ns = [j.header.stamp.sec * 10**9 + j.header.stamp.nanosec for j in joints]
        step_ns = [s.header.stamp.sec * 10**9 + s.header.stamp.nanosec for s in steps]
        assert 0 < max(step_ns) <= max(sim_ns) + 10**9  # the policy's stamps are sim time, not the wall clock
    finally:
        terminate_all([proc for proc, _log in procs])
        for _proc, log in procs:
            log.close()
        listener.destroy_node()
