"""The scripted Pusher expert: it pushes the object into the goal on held-out episodes, from behind the object
(the side away from the goal), and it is a function of the observation alone."""
import numpy as np
import pytest

from flashrt_ros.sim.expert import GOAL, HAND, OBJECT, PusherExpert, run_episode
from flashrt_ros.sim.record import HELD_OUT_SEED_BASE
from flashrt_ros.sim.world import PusherWorld


@pytest.fixture(scope="module")
def world():
    return PusherWorld()


@pytest.fixture(scope="module")
def expert(world):
    return PusherExpert(world)


@pytest.mark.parametrize("seed", [HELD_OUT_SEED_BASE + k for k in (0, 1, 2)])
def test_the_expert_pushes_the_object_into_the_goal(world, expert, seed):
    assert run_episode(world, expert, seed, seconds=10.0)
    assert world.object_to_goal() <= world.config.success_radius


def test_the_hand_first_touches_the_object_from_the_side_away_from_the_goal(world, expert):
    obs = world.reset(HELD_OUT_SEED_BASE + 4)
    start = obs[OBJECT].copy()
    for _ in range(1000):
        obs = world.step(expert(obs))
        if np.linalg.norm(obs[OBJECT] - start) > 1e-3:  # the first push has moved it
            break
    else:
        pytest.fail("the object never moved")
    toward_goal = (obs[GOAL] - start) / np.linalg.norm(obs[GOAL] - start)
    assert (obs[HAND][:2] - start) @ toward_goal < 0
    assert np.linalg.norm(obs[OBJECT] - obs[GOAL]) < np.linalg.norm(start - obs[GOAL])


def test_the_experts_targets_depend_on_the_observation_alone(world, expert):
    first = world.reset(HELD_OUT_SEED_BASE + 5)
    later = first
    for _ in range(50):
        later = world.step(expert(later))
    fresh = PusherExpert(world)
    np.testing.assert_array_equal(expert(first), fresh(first))
    np.testing.assert_array_equal(expert(later), fresh(later))


def test_the_experts_targets_stay_inside_the_joint_ranges(world, expert):
    obs = world.reset(HELD_OUT_SEED_BASE + 6)
    for _ in range(300):
        targets = expert(obs)
        assert np.all(targets >= world.joint_range[:, 0]) and np.all(targets <= world.joint_range[:, 1])
        obs = world.step(targets)
