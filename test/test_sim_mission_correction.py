"""Sensor faults and the rollback correction, offline (sim/faults.py, sim/correction.py): a fault corrupts its
window only, and the one committed replan that re-steps the corrected readings leaves the policy byte-identical
to a Session that stepped the true readings from the start."""
from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.sim.correction import run_fault_episode, tracking_error
from flashrt_ros.sim.evaluate import policy_session
from flashrt_ros.sim.faults import KINDS, OBJECT, POSITIONS, FaultConfig, FaultySensor, SensorFault, draw_faults
from flashrt_ros.sim.record import HELD_OUT_SEED_BASE
from flashrt_ros.sim.world import PusherWorld

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "policies" / "pusher.safetensors"
SEED = HELD_OUT_SEED_BASE + 1
SECONDS = 3.0


@pytest.fixture(scope="module")
def world():
    return PusherWorld()


@pytest.fixture(scope="module")
def session():
    return policy_session(str(SHIPPED), backend="numpy", capsule_budget_mb=8.0)


@pytest.fixture(scope="module")
def reference():
    return policy_session(str(SHIPPED), backend="numpy", capsule_budget_mb=8.0)


def test_the_same_seed_draws_the_same_faults_apart_from_each_other_with_late_corrections():
    faults = draw_faults(SEED, 1000)
    assert faults == draw_faults(SEED, 1000)
    assert faults != draw_faults(SEED + 1, 1000)
    c = FaultConfig()
    for f, after in zip(faults, faults[1:] + [None]):
        assert f.kind in KINDS and f.start >= c.first_step
        lo, hi = c.object_steps if f.kind == "stale_object" else c.joint_steps
        assert lo <= f.end - f.start + 1 <= hi
        assert 3 <= f.delay <= 20  # 30-200 ms at 100 Hz
        assert f.arrival <= 1000 and (after is None or after.start > f.arrival)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fault_corrupts_its_window_only_and_the_sensor_reads_true_outside_it(kind):
    fault = SensorFault(kind, 3, 5, 4, 7)
    sensor = FaultySensor([fault])
    readings = [np.arange(21, dtype=np.float32) + 100 * n for n in range(1, 8)]
    seen = [sensor.read(n, o) for n, o in zip(range(1, 8), readings)]
    for n in (1, 2, 6, 7):
        assert seen[n - 1].tobytes() == readings[n - 1].tobytes()
    for n in (3, 4, 5):
        assert seen[n - 1].tobytes() != readings[n - 1].tobytes()
        changed = np.flatnonzero(seen[n - 1] != readings[n - 1])
        allowed = range(OBJECT.start, OBJECT.stop) if kind == "stale_object" else range(POSITIONS.start, 17)
        assert set(changed) <= set(allowed), (kind, changed)
    if kind == "stale_object":
        assert seen[4][OBJECT].tobytes() == readings[1][OBJECT].tobytes()  # held at the last good reading


def test_a_fault_leaves_the_world_and_the_policy_untouched_before_it_starts(world, session):
    faults = draw_faults(SEED, int(SECONDS * 100))
    start = faults[0].start
    seen = {}

    def at(tag):
        def hook(n, s, w):
            if n in (start - 1, start + 2):
                seen[tag, n] = (w.state(), s.state_host(0).tobytes())
        return hook

    run_fault_episode(world, session, SEED, [], False, SECONDS, on_step=at("clean"))
    run_fault_episode(world, session, SEED, faults, False, SECONDS, on_step=at("faulty"))
    assert seen["clean", start - 1] == seen["faulty", start - 1]
    # the fault's first bad reading reaches the policy at once, and through its targets the world
    assert seen["clean", start + 2][1] != seen["faulty", start + 2][1]
    assert seen["clean", start + 2][0] != seen["faulty", start + 2][0]


def test_the_correction_commits_a_state_byte_identical_to_stepping_the_true_readings(world, session, reference):
    faults = draw_faults(SEED, int(SECONDS * 100))
    assert len(faults) >= 2
    run = run_fault_episode(world, session, SEED, faults, True, SECONDS, reference=reference)
    assert run.byte_exact == [True] * len(faults)
    assert len(run.replan_ms) == len(faults)
    # checked apart from the episode's own reference: every fault corrected, the live state is that of a Session
    # that stepped the true readings one by one
    fresh = policy_session(str(SHIPPED), backend="numpy", capsule_budget_mb=8.0)
    for obs in run.true_obs:
        fresh.step(obs)
    assert session.state_host(0).tobytes() == fresh.state_host(0).tobytes()


def test_without_the_correction_the_policy_keeps_the_bad_readings(world, session):
    faults = draw_faults(SEED, int(SECONDS * 100))
    run = run_fault_episode(world, session, SEED, faults, False, SECONDS)
    assert run.replan_ms == [] and run.byte_exact == []
    fresh = policy_session(str(SHIPPED), backend="numpy", capsule_budget_mb=8.0)
    for obs in run.true_obs:
        fresh.step(obs)
    assert session.state_host(0).tobytes() != fresh.state_host(0).tobytes()


def test_tracking_error_is_zero_against_itself_and_grows_with_uncorrected_faults(world, session):
    faults = draw_faults(SEED, int(SECONDS * 100))
    clean = run_fault_episode(world, session, SEED, [], False, SECONDS)
    faulty = run_fault_episode(world, session, SEED, faults, False, SECONDS)
    assert tracking_error(clean, clean) == (0.0, 0.0)
    joint, hand = tracking_error(faulty, clean)
    assert joint > 0 and hand > 0
