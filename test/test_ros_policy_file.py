"""A node given a policy file through policy_path alone: it takes its sizes from the file, names the
trajectory's joints from the file's action channels, and publishes the file's actions in the robot's units."""
import numpy as np
import pytest
from ros_harness import FAST
from test_policy_file import trained_like_weights
from test_ros_outputs import Outputs

from conftest import observation_trace
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.model.policy_file import save_policy

pytestmark = pytest.mark.ros

JOINTS = [f"panda_joint{i + 1}" for i in range(7)]
# sizes none of the node's defaults has: the node can only run this file by taking them from it
ARCH = dict(obs_dim=14, action_dim=7, d_model=48, n_layers=2, n_heads=4, chunk_len=5, kv_window=FAST["kv_window"],
            mixer="ssm", chunk_blend="oldest", chunk_blend_decay=0.01)


@pytest.fixture
def node_params(tmp_path):
    cfg = PolicyConfig(**ARCH)
    save_policy(tmp_path / "policy.safetensors", cfg, trained_like_weights(cfg, seed=7),
                obs_names=JOINTS + [j + "/velocity" for j in JOINTS], action_names=JOINTS)
    return {"policy_path": str(tmp_path / "policy.safetensors"), "publish_trajectory": True}


def test_a_node_given_only_policy_path_runs_the_file_and_commands_in_robot_units(flashrt, tmp_path):
    _, planner = flashrt
    units = trained_like_weights(PolicyConfig(**ARCH), seed=7)
    outputs = Outputs(planner, units=(units["action_scale"], units["action_offset"]))  # the file's
    obs = observation_trace(30)
    outputs.linked(obs[:3])
    n0 = len(planner.steps)  # linked() steps until the outputs flow: 1 to 3 observations
    got = planner.run(obs[n0:])
    ref = Session(PolicyConfig(policy_path=str(tmp_path / "policy.safetensors"), capsule_budget_mb=64.0), "numpy")
    want = np.stack([ref.step(o).action for o in obs])[n0:]
    assert got.tobytes() == want.tobytes()  # the node's action bytes are the file's policy's
    assert np.abs(got).max() > 1.0  # past tanh's (-1, 1): only action_scale / action_offset get there
    assert outputs.wait(len(obs) - n0)
    assert list(outputs.trajectories[-1].joint_names) == JOINTS  # named by the file's action channels
    assert len(outputs.trajectories[-1].points) == ARCH["chunk_len"]
    # the trajectory in the robot's units too (issue 44.5): the chunk with action_scale / action_offset applied
    chunk = np.asarray(planner.steps[-1].action_chunk, np.float32).reshape(ARCH["chunk_len"], 7)
    positions = np.array([p.positions for p in outputs.trajectories[-1].points])
    assert positions.tobytes() == (chunk * units["action_scale"].astype(np.float64) + units["action_offset"]).tobytes()
    assert np.abs(positions).max() > 1.0
