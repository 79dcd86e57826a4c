"""The MuJoCo Pusher world alone (no ROS): seeded resets and the physics step are byte-exact, its state bytes
round-trip, and targets out of the joints' ranges are clipped, never applied."""
import numpy as np
import pytest

from flashrt_ros.sim.world import ARM_JOINTS, CONTROL_HZ, OBS_DIM, OBS_NAMES, PusherWorld


@pytest.fixture(scope="module")
def world():
    return PusherWorld()


def test_the_same_seed_resets_to_the_same_state_bytes_and_another_seed_does_not(world):
    world.reset(7)
    first = world.state()
    world.reset(8)
    other = world.state()
    world.reset(7)
    assert world.state() == first
    assert other != first


def test_a_step_from_a_restored_state_is_byte_identical(world):
    world.reset(3)
    for _ in range(20):
        world.step(world.joint_positions() + 0.05)
    saved = world.state()
    targets = world.joint_positions() - 0.1
    for _ in range(5):
        world.step(targets)
    after = world.state()
    world.set_state(saved)
    assert world.state() == saved
    for _ in range(5):
        world.step(targets)
    assert world.state() == after


def test_one_step_is_one_control_period_of_sim_time(world):
    world.reset(0)
    t0 = world.time_ns
    world.step(world.joint_positions())
    assert world.time_ns - t0 == 1_000_000_000 // CONTROL_HZ


def test_a_joint_target_pulls_its_joint_toward_it(world):
    obs = world.reset(0)
    targets = obs[:7].copy()
    targets[0] += 0.3
    for _ in range(100):
        obs = world.step(targets)
    assert abs(obs[0] - targets[0]) < 0.05
    assert np.abs(obs[1:7] - targets[1:]).max() < 0.05


def test_targets_past_a_joint_limit_are_clipped_to_it(world):
    world.reset(0)
    targets = world.joint_positions()
    targets[3] = 5.0  # the elbow's range ends at 0
    world.step(targets)
    assert world.targets[3] == world.joint_range[3, 1]


def test_a_state_of_another_size_is_refused(world):
    world.reset(0)
    with pytest.raises(ValueError, match="bytes"):
        world.set_state(world.state()[:-8])


def test_non_finite_targets_are_refused_and_the_state_is_unchanged(world):
    world.reset(0)
    before = world.state()
    with pytest.raises(ValueError, match="finite"):
        world.step([np.nan] * len(ARM_JOINTS))
    assert world.state() == before


def test_the_observation_has_a_name_per_channel_and_places_object_and_goal(world):
    obs = world.reset(5)
    assert len(OBS_NAMES) == OBS_DIM == obs.shape[0]
    obj = obs[OBS_NAMES.index("object.x"):OBS_NAMES.index("object.y") + 1]
    goal = obs[OBS_NAMES.index("goal.x"):OBS_NAMES.index("goal.y") + 1]
    assert np.linalg.norm(obj - goal) == pytest.approx(world.object_to_goal())
    assert world.object_to_goal() > world.config.min_distance
    assert not world.success()


def test_every_reset_places_the_object_where_the_hand_can_get_behind_it(world):
    c = world.config
    i = {n: OBS_NAMES.index(n) for n in ("object.x", "object.y", "goal.x", "goal.y")}
    for seed in range(200):
        obs = world.reset(seed)
        obj = obs[[i["object.x"], i["object.y"]]]
        goal = obs[[i["goal.x"], i["goal.y"]]]
        behind = obj - c.approach * (goal - obj) / np.linalg.norm(goal - obj)
        assert c.min_reach <= np.linalg.norm(behind - world.shoulder_xy) <= c.max_reach
        assert np.linalg.norm(goal - obj) > c.min_distance
