"""Recordings beside the expert's own rollouts: --perturb (the arm executes the expert's targets plus a drifting
offset), --driver FILE (a policy drives the arm, DAgger) and --faults (the observations carry the seeded sensor
faults); every way the bags keep the expert's targets."""
import numpy as np

from flashrt_ros.runtime.model.config import PolicyConfig
from flashrt_ros.runtime.model.policy import HybridPolicy
from flashrt_ros.runtime.model.policy_file import save_policy
from flashrt_ros.runtime.model.weights import seeded_weights
from flashrt_ros.sim.cli import main as sim_main
from flashrt_ros.sim.evaluate import joint_targets, policy_session
from flashrt_ros.sim.expert import PusherExpert
from flashrt_ros.sim.faults import FaultySensor, draw_faults
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


def test_faulty_recordings_carry_the_evaluations_faulty_readings_and_the_experts_answers_to_the_truth(tmp_path):
    plain = _record(tmp_path, "plain", "--seconds", "0.8", "--seed", "1")
    faulty = _record(tmp_path, "faulty", "--seconds", "0.8", "--seed", "1", "--faults")
    faults = draw_faults(recording_seed(1, 0), 80)
    assert faults[0].kind == "zeroed" and faults[0].end <= len(faulty)  # this seed's first fault: readings of 0
    # the expert acts on the true state, so the arm moves as in the plain recording: the same answers, byte for byte
    assert faulty.actions.tobytes() == plain.actions.tobytes()
    sensor = FaultySensor(faults)
    expected = np.stack([sensor.read(n, obs) for n, obs in enumerate(plain.obs, start=1)])
    assert faulty.obs.tobytes() == expected.astype(faulty.obs.dtype).tobytes()
    bad = [n - 1 for n in range(1, len(faulty) + 1) if sensor.fault_at(n)]
    assert (faulty.obs[bad] != plain.obs[bad]).any(axis=1).all()  # every reading inside a fault is corrupted
    clean = np.setdiff1d(np.arange(len(faulty)), bad)
    assert faulty.obs[clean].tobytes() == plain.obs[clean].tobytes()
