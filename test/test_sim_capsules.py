"""World capsules: a capsule taken at a sim time brings the world back byte-exactly, a fork replays the live
world's future byte for byte, a restore drops the rewritten future, and the ring keeps only the newest."""
import pytest

from flashrt_ros.sim.capsules import WorldCapsules
from flashrt_ros.sim.expert import PusherExpert
from flashrt_ros.sim.world import PusherWorld


@pytest.fixture
def run():
    world = PusherWorld()
    expert = PusherExpert(world)
    capsules = WorldCapsules(capacity=1000)
    obs = world.reset(11)
    states = {capsules.take(world): world.state()}
    for _ in range(200):
        obs = world.step(expert(obs))
        states[capsules.take(world)] = world.state()
    return world, expert, capsules, states


def test_each_capsule_holds_the_worlds_state_bytes_at_its_sim_time(run):
    world, _, capsules, states = run
    for stamp in (0, 500_000_000, world.time_ns):
        assert capsules.at(stamp) == (stamp, states[stamp])


def test_a_time_between_two_steps_finds_the_capsule_before_it(run):
    _, _, capsules, states = run
    assert capsules.at(1_234_567_890 // 10_000_000 * 10_000_000 + 5)[0] == 1_230_000_000


def test_a_fork_replays_the_live_worlds_future_byte_for_byte(run):
    world, expert, capsules, states = run
    twin = capsules.fork(1_000_000_000, world)
    obs = twin.observation()
    while twin.time_ns < world.time_ns:
        obs = twin.step(expert(obs))
    assert twin.state() == states[world.time_ns] == world.state()


def test_a_restore_makes_the_capsule_live_and_drops_the_newer_ones(run):
    world, _, capsules, states = run
    assert capsules.restore(world, 1_000_000_000) == 1_000_000_000
    assert world.state() == states[1_000_000_000]
    assert len(capsules) == 101
    with pytest.raises(ValueError, match="not after"):
        capsules.take(world)  # the restored time is kept already
    world.step(world.joint_positions())
    assert capsules.take(world) == 1_010_000_000


def test_the_ring_keeps_the_newest_capsules_only():
    world = PusherWorld()
    capsules = WorldCapsules(capacity=3)
    world.reset(0)
    for _ in range(5):
        world.step(world.joint_positions())
        capsules.take(world)
    assert len(capsules) == 3
    assert capsules.at(world.time_ns)[0] == world.time_ns
    with pytest.raises(KeyError, match="oldest is 30000000"):
        capsules.at(20_000_000)
