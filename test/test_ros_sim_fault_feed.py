"""The sim node's faulty sensor (sim/fault_feed.py): it reports what the offline FaultySensor reports, and a fault's
correction goes out before the reading it arrives with, carrying the true readings and their stamps exactly."""
import numpy as np

from flashrt_ros.sim.fault_feed import FaultFeed, parse_correction
from flashrt_ros.sim.faults import FaultySensor, draw_faults

SEED, STEPS = 2**32, 400


def _true_readings(n: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    return rng.normal(0.0, 0.3, (n, 21))  # float64, as the world's observation


def test_feed_reports_the_offline_faulty_readings_and_each_correction_on_its_arrival():
    true = _true_readings(STEPS)
    feed, offline = FaultFeed(), FaultySensor(draw_faults(SEED, STEPS))
    feed.start(SEED, STEPS)
    assert feed.faults == offline.faults and len(feed.faults) >= 2
    arrivals = {f.arrival: f for f in feed.faults}
    for n in range(1, STEPS + 1):
        reading, correction = feed.read(n * 10_000_000, true[n - 1])
        assert reading.tobytes() == offline.read(n, true[n - 1]).tobytes()
        assert (correction is not None) == (n in arrivals)
        if correction is not None:
            fault, c = arrivals[n], parse_correction(correction)
            assert (c.kind, c.bad_readings) == (fault.kind, fault.end - fault.start + 1)
            assert c.stamps_ns.tolist() == [k * 10_000_000 for k in range(fault.start, n)]
            assert c.observations.tobytes() == true[fault.start - 1:n - 1].astype(np.float32).tobytes()


def test_a_new_episode_draws_its_own_faults_and_forgets_the_last_readings():
    feed = FaultFeed()
    feed.start(SEED, STEPS)
    first = list(feed.faults)
    feed.read(0, _true_readings(1)[0])
    feed.start(SEED + 1, STEPS)
    assert feed.faults == draw_faults(SEED + 1, STEPS) != first and feed.reading == 0
