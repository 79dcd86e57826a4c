"""The shipped policy through ROS (flashrt-sim --policy FILE --success-rate --ros): the evaluation wires the policy
node as the launch file does, the offline loop applies what the node publishes, and an episode runs end to end."""
from pathlib import Path

import numpy as np
import pytest
from launch_subset import resolve

from flashrt_ros.ros.io.outputs import trajectory_points
from flashrt_ros.sim import ros_eval
from flashrt_ros.sim.evaluate import joint_targets, policy_session
from flashrt_ros.sim.record import HELD_OUT_SEED_BASE
from flashrt_ros.sim.world import PusherWorld

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "config" / "policies" / "pusher.safetensors"
pytestmark = pytest.mark.ros


def test_the_evaluation_wires_the_policy_node_as_the_launch_file_does():
    nodes = {n.executable: n for n in resolve(ROOT / "launch" / "flashrt_sim.launch.py", {}, {"flashrt_ros": ROOT})}
    params = nodes["flashrt_node"].parameters
    assert params[-1] == ros_eval.POLICY_OVERRIDES
    assert params[-2] == {"policy_path": str(SHIPPED)}  # the launch file runs the shipped policy by default


def test_the_offline_targets_are_the_first_point_of_the_nodes_trajectory():
    session = policy_session(str(SHIPPED), backend="numpy")
    obs = PusherWorld().reset(HELD_OUT_SEED_BASE)
    chunk = session.step(np.asarray(obs, np.float32)).chunk
    w = session.weights
    positions, _ = trajectory_points(chunk, w["action_scale"], w["action_offset"], 0.01)
    assert joint_targets(session, chunk).tobytes() == np.asarray(positions[0], np.float64).tobytes()


@pytest.mark.serial  # the sim's 100 Hz loop in real time: the policy must answer most of its observations
def test_an_episode_through_ros_steps_the_policy_on_the_sims_observations(ros_domain, monkeypatch, capsys):
    from flashrt_ros.sim import cli

    for key, value in ros_domain.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["--policy", str(SHIPPED), "--success-rate", "--ros", "--episodes", "1", "--seconds", "1.0"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"seed {HELD_OUT_SEED_BASE}:"))
    steps = int(line.split("(")[1].split()[0])
    assert steps >= 50, out  # 1 s of sim at 100 Hz: the policy answered the sim's observations, not a few
    assert "(through ROS)" in out
