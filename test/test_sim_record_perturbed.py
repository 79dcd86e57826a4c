"""Recordings beside the expert's own rollouts: --perturb (the arm executes the expert's targets plus a drifting
offset) and --driver FILE (a policy drives the arm, DAgger); either way the bags keep the expert's targets."""
import numpy as np

from flashrt_ros.runtime.model.config import PolicyConfig
from flashrt_ros.runtime.model.policy import HybridPolicy
from flashrt_ros.runtime.model.policy_file import save_policy
from flashrt_ros.runtime.model.weights import seeded_weights
from flashrt_ros.sim.cli import main as sim_main
from flashrt_ros.sim.evaluate import joint_targets, policy_session
from flashrt_ros.sim.expert import PusherExpert
from flashrt_ros.sim.record import COMMAND_TOPIC, OBS_TOPIC, recording_seed
from flashrt_ros.sim.world import ARM_JOINTS, OBS_NAMES, PusherWorld
from flashrt_ros.train.data import read_episodes


def _record(tmp_path, name, *flags):
    out = tmp_path / name
    assert sim_main(["--expert", "--record", str(out), "--episodes", "1", "--seconds", "0.5", *flags]) == 0
    return read_episodes(sorted(out.iterdir()), OBS_TOPIC, COMMAND_TOPIC)[0]


def test_a_perturbed_arm_leaves_the_experts_path_and_the_bag_keeps_the_experts_answers(tmp_path):
    plain = _record(tmp_path, "plain")
    perturbed = _record(tmp_path, "perturbed", "--perturb", "0.05")
    np.testing.assert_array_equal(perturbed.obs[0], plain.obs[0])  # the same episode
    assert np.abs(perturbed.obs[:, :7] - plain.obs[:, :7]).max() > 0.01  # the arm went elsewhere
    expert = PusherExpert(PusherWorld())
    for obs, action in zip(perturbed.obs, perturbed.actions):  # float32 observations: rounding, no more
        np.testing.assert_allclose(action, expert(obs.astype(np.float64)), atol=1e-4)


def test_a_policy_drives_the_arm_and_the_bag_holds_the_experts_answer_to_each_step(tmp_path):
    cfg = PolicyConfig(obs_dim=len(OBS_NAMES), action_dim=len(ARM_JOINTS), d_model=16, n_layers=1, n_heads=2,
                       kv_window=8, chunk_len=1)
    policy = tmp_path / "driver.safetensors"
    save_policy(policy, cfg, seeded_weights(HybridPolicy(cfg).weight_specs(), 3), OBS_NAMES, ARM_JOINTS)
    ep = _record(tmp_path, "dagger", "--driver", str(policy), "--backend", "numpy")
    world = PusherWorld()
    expert, session = PusherExpert(world), policy_session(str(policy), backend="numpy")
    obs = world.reset(recording_seed(0, 0))
    for t in range(len(ep)):  # the world under the policy's targets, labelled by the expert, step by step
        np.testing.assert_array_equal(ep.obs[t], obs.astype(np.float32))
        np.testing.assert_array_equal(ep.actions[t], expert(obs).astype(np.float32))
        obs = world.step(joint_targets(session, session.step(np.float32(obs)).chunk))
