"""What-ifs judged by the world, offline (sim/whatif.py): one batched replan gives each hypothesis' actions, each
is rolled through a fork of the live physics, and the branch whose fork ends with the object nearest the goal is
committed; the live world then executes it and ends byte-identical to that fork."""
from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.sim.evaluate import policy_session
from flashrt_ros.sim.faults import OBJECT
from flashrt_ros.sim.record import HELD_OUT_SEED_BASE
from flashrt_ros.sim.whatif import WhatIfConfig, action_targets, draw_bias, hypotheses, run_biased_episode, what_if
from flashrt_ros.sim.world import PusherWorld

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "policies" / "pusher.safetensors"
CONFIG = WhatIfConfig()


@pytest.fixture(scope="module")
def worlds():
    return PusherWorld(), PusherWorld()


@pytest.fixture(scope="module")
def session():
    return policy_session(str(SHIPPED), backend="numpy", max_branches=CONFIG.hypotheses, capsule_budget_mb=8.0)


@pytest.fixture(scope="module")
def committed(worlds, session):
    """The first episode of the held-out seeds whose what-ifs commit a branch, and that branch's what-if."""
    world, twin = worlds
    for seed in range(HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 5):
        episode = run_biased_episode(world, twin, session, seed, True, 6.0, CONFIG)
        chosen = next((w for w in episode.what_ifs if w.committed >= 0), None)
        if chosen is not None:
            return seed, episode, chosen
    pytest.fail("no what-if committed a branch in 5 episodes of 6 s: the hand never reached the object")


def test_the_hypotheses_are_the_estimate_then_a_ring_around_it():
    estimate = np.array([0.1, -0.2])
    hyps = hypotheses(estimate, 0.04, 9)
    assert hyps.shape == (9, 2) and hyps[0].tobytes() == estimate.tobytes()
    assert np.allclose(np.linalg.norm(hyps[1:] - estimate, axis=1), 0.04)
    assert len({tuple(np.round(h, 9)) for h in hyps}) == 9


def test_the_estimates_error_is_seeded_and_within_its_range():
    bias = draw_bias(HELD_OUT_SEED_BASE)
    assert bias.tobytes() == draw_bias(HELD_OUT_SEED_BASE).tobytes()
    assert bias.tobytes() != draw_bias(HELD_OUT_SEED_BASE + 1).tobytes()
    assert CONFIG.bias_m[0] <= np.linalg.norm(bias) <= CONFIG.bias_m[1]


def test_the_what_if_commits_the_branch_whose_fork_ends_nearest_the_goal(committed, worlds):
    seed, episode, chosen = committed
    _, twin = worlds
    # the forks again, from the world as it was: the committed branch is the best one, by the world's judgement
    scores = []
    for actions in chosen.actions:
        twin.set_state(chosen.world_state)
        for action in actions:
            twin.step(action_targets(action))
        scores.append(twin.object_to_goal())
    assert scores == chosen.scores
    assert max(scores) - min(scores) >= CONFIG.decisive_m
    assert chosen.committed == int(np.argmin(scores))
    assert all(episode.byte_exact) and len(episode.byte_exact) == sum(w.committed >= 0 for w in episode.what_ifs)


def test_a_commit_makes_the_best_branchs_state_live_and_the_world_follows_its_fork(committed, worlds, session):
    seed, _, chosen = committed
    world, twin = worlds
    # the same episode, ended right after that what-if's actions: nothing stepped since the commit
    seconds = (chosen.step + CONFIG.horizon - 1) / 100
    episode = run_biased_episode(world, twin, session, seed, True, seconds, CONFIG)
    last = episode.what_ifs[-1]
    assert (last.step, last.committed) == (chosen.step, chosen.committed)
    live = session.state_host(0).tobytes()
    assert live == session.capsule_host(last.branch_capsules[last.committed]).tobytes()
    worst = int(np.argmax(last.scores))
    assert live != session.capsule_host(last.branch_capsules[worst]).tobytes()
    assert world.state() == last.fork_states[last.committed]


def test_without_selection_no_what_if_runs_and_the_same_seed_gives_the_same_episode(worlds, session):
    world, twin = worlds
    one = run_biased_episode(world, twin, session, HELD_OUT_SEED_BASE + 2, False, 1.0, CONFIG)
    state = world.state()
    again = run_biased_episode(world, twin, session, HELD_OUT_SEED_BASE + 2, False, 1.0, CONFIG)
    assert one.what_ifs == [] and again.what_ifs == []
    assert world.state() == state



def test_branch_zero_of_a_what_if_takes_the_action_the_live_step_would(worlds, session):
    world, twin = worlds
    obs = world.reset(HELD_OUT_SEED_BASE + 3)
    session.reset()
    for _ in range(30):
        obs = world.step(action_targets(session.step(np.asarray(obs, np.float32)).action))
    reading = np.asarray(obs, np.float32)
    before = session.state_host(0).tobytes()
    hyps = hypotheses(reading[OBJECT].astype(np.float64), 0.04, 3)
    chosen = what_if(session, world, twin, reading, hyps, 2, 31, decisive_m=float("inf"))  # commits nothing
    assert chosen.committed == -1
    assert session.state_host(0).tobytes() == before
    assert session.step(reading).action.tobytes() == chosen.actions[0, 0].tobytes()
    assert chosen.actions[1, 0].tobytes() != chosen.actions[0, 0].tobytes()  # another object, another action
