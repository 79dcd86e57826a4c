"""A 200 Hz sensor process, while this process rolls back and re-plans in a loop for 10 s."""
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros


@pytest.fixture
def node_params():
    return {"observation_reliable": False}  # sensor-data QoS, as a real driver publishes


def test_sensor_stream_with_concurrent_rollbacks_and_replans(flashrt, ros_domain, tmp_path):
    proc, planner = flashrt
    sensor = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.sensor_sim", "--rate", "200",
                               "--duration", "11", "--namespace", "/test"], env=ros_domain,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rng = np.random.default_rng(0)
    obs = observation_trace(64)
    jumps, replans = set(), []
    try:
        wait_end = time.monotonic() + 20
        while not planner.steps and time.monotonic() < wait_end:  # stream flowing
            planner.spin(0.05)
        assert planner.steps, "no policy_step from the sensor stream"
        end = time.monotonic() + 10.0
        i = 0
        while time.monotonic() < end:
            i += 1
            r = planner.client.rollback(steps_back=int(rng.integers(1, 10)))
            if r.success:
                jumps.add(r.capsule.step)
            commit = 1 if i % 5 == 0 else -1
            out = planner.client.replan(np.stack([obs[:8] + 0.1 * b for b in range(4)]), commit_branch=commit)
            replans.append(out)
            if commit >= 0 and out.result.success:
                committed = out.result.branch_capsule_ids[commit]
                lst = planner.client.call("list_capsules")
                jumps.add(next(c.step for c in lst.capsules if c.id == committed))
            planner.spin(0.01)
        sensor_out, _ = sensor.communicate(timeout=20)
    finally:
        if sensor.poll() is None:
            sensor.kill()
    planner.spin(0.5)
    assert sensor.returncode == 0 and "Traceback" not in sensor_out, sensor_out
    assert len(replans) > 20
    for out in replans:
        assert out.accepted
        assert out.result.success or (not out.result.deadline_met and out.result.message), out.result
        assert out.result.success and (out.result.deadline_met or "deadline" in out.result.message)
    steps = planner.steps
    # observations that arrive during a replan are held, latest only, so not all 2000 become steps; the
    # stream must still keep flowing the whole time
    stamps = np.array([m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in steps])
    assert len(steps) > 300 and np.diff(stamps).max() < 0.5, (len(steps), np.diff(stamps).max())
    ids = [m.capsule_id for m in steps]
    assert all(b > a for a, b in zip(ids, ids[1:])), "a capsule id repeated or went backwards"
    bad = [(a.step, b.step) for a, b in zip(steps, steps[1:]) if b.step != a.step + 1 and b.step - 1 not in jumps]
    assert not bad, f"lost or duplicated step numbers: {bad[:10]}"
    out = proc.output()
    assert "Traceback" not in out and "Error" not in out, out[-3000:]
