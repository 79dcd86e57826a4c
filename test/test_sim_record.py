"""flashrt-sim --expert --record: one bag per episode that flashrt-train's reader pairs one to one, on sim time,
with the expert's own targets; recording seeds never reach the held-out ones."""
import numpy as np
import pytest

from flashrt_ros.sim.cli import main as sim_main
from flashrt_ros.sim.expert import PusherExpert
from flashrt_ros.sim.record import COMMAND_TOPIC, HELD_OUT_SEED_BASE, OBS_TOPIC, recording_seed
from flashrt_ros.sim.world import ARM_JOINTS, OBS_DIM, PusherWorld
from flashrt_ros.train.data import read_episodes


def test_recorded_bags_pair_every_observation_with_the_experts_targets_for_it(tmp_path, capsys):
    assert sim_main(["--expert", "--record", str(tmp_path / "bags"), "--episodes", "2", "--seconds", "0.5"]) == 0
    assert "wrote 2 bags" in capsys.readouterr().out
    bags = sorted((tmp_path / "bags").iterdir())
    assert [b.name for b in bags] == ["episode_000", "episode_001"]
    episodes = read_episodes(bags, OBS_TOPIC, COMMAND_TOPIC)
    world = PusherWorld()
    expert = PusherExpert(world)
    for i, ep in enumerate(episodes):
        assert ep.obs.shape == (50, OBS_DIM) and ep.actions.shape == (50, len(ARM_JOINTS))
        assert ep.valid.all() and ep.counts["unused_actions"] == 0
        assert ep.action_names == list(ARM_JOINTS)
        assert ep.period_s == pytest.approx(0.01)
        obs = world.reset(recording_seed(0, i))
        for t in range(len(ep)):  # the bag holds the world's own trajectory under the expert, step by step
            np.testing.assert_array_equal(ep.obs[t], obs.astype(np.float32))
            targets = expert(obs)
            np.testing.assert_array_equal(ep.actions[t], targets.astype(np.float32))
            obs = world.step(targets)
    assert not np.array_equal(episodes[0].obs[0], episodes[1].obs[0])  # randomised episodes


def test_recording_into_a_directory_that_holds_a_bag_is_refused(tmp_path, capsys):
    (tmp_path / "episode_000").mkdir()
    assert sim_main(["--expert", "--record", str(tmp_path), "--episodes", "1", "--seconds", "0.1"]) == 2
    assert "exists" in capsys.readouterr().err


def test_record_needs_the_expert(tmp_path, capsys):
    assert sim_main(["--record", str(tmp_path)]) == 2
    assert "need --expert" in capsys.readouterr().err


def test_recording_seeds_stay_below_the_held_out_ones():
    assert recording_seed(9_999, 99_999) < HELD_OUT_SEED_BASE
    with pytest.raises(ValueError):
        recording_seed(10_000, 0)
