"""A 200 Hz sensor process, while this process rolls back and re-plans in a loop for 10 s."""
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import observation_trace

pytestmark = [pytest.mark.ros, pytest.mark.serial]  # the 100 Hz loop's receive gaps are timed


@pytest.fixture
def node_params():
    # sensor-data QoS, as a real driver publishes; 2 s of capsules at 200 Hz, so a committed branch is still
    # listed when the test looks its step up (48, the harness's, is 0.24 s: a loaded machine evicted it first)
    return {"observation_reliable": False, "capsule_capacity": 400}


def test_sensor_stream_with_concurrent_rollbacks_and_replans(flashrt, ros_domain, tmp_path):
    proc, planner = flashrt
    sensor = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.demo.sensor_sim", "--rate", "200",
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
            out = planner.client.replan(np.stack([obs[:8] + 0.1 * b for b in range(4)]),
                                        commit_branch=commit if commit >= 0 else None)
            replans.append(out)
            if commit >= 0 and out.succeeded:
                committed = out.result.branch_capsule_ids[commit]
                lst = planner.client.list_capsules()
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
        # one client waits for each answer, so no goal is refused as busy; a replan that ran succeeds,
        # and one that ran out of time says so (a partial result)
        assert out.accepted and out.succeeded, out.reason or out.result.message
        assert out.result.deadline_met or "deadline" in out.result.message, out.result.message
    steps = planner.steps
    # observations arrive faster than the queue drains while replans and rollbacks run, so not all 2000
    # become steps; the stream must still keep flowing the whole time
    stamps = np.array([m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in steps])
    assert len(steps) > 300 and np.diff(stamps).max() < 0.5, (len(steps), np.diff(stamps).max())
    ids = [m.capsule_id for m in steps]
    assert all(b > a for a, b in zip(ids, ids[1:])), "a capsule id repeated or went backwards"
    bad = [(a.step, b.step) for a, b in zip(steps, steps[1:]) if b.step != a.step + 1 and b.step - 1 not in jumps]
    assert not bad, f"lost or duplicated step numbers: {bad[:10]}"
    out = proc.output()
    assert "Traceback" not in out and "Error" not in out, out[-3000:]


CLIENT = """
import json, sys, time, rclpy, numpy as np
from flashrt_ros.ros.client import FlashRTClient
rclpy.init()
node = rclpy.create_node(sys.argv[1])
client = FlashRTClient(node, "/test")
client.wait_until_ready(30)
obs = np.stack([np.linspace(-1, 1, 8 * 14, dtype=np.float32).reshape(8, 14) * (1 + 0.1 * b) for b in range(4)])
print("ready", flush=True)
counts = {"ran": 0, "busy": 0, "other": 0}
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:  # back to back: the next goal as soon as the last one is answered
    out = client.replan(obs, timeout_s=10.0)
    counts["ran" if out.succeeded else "busy" if "busy" in out.reason else "other"] += 1
print(json.dumps(counts), flush=True)
"""
RATE_HZ, STREAM_S = 100.0, 6.0
# Gaps, two ways. On the sensor's timeline: at most 4 published observations in a row left unstepped.
# Waiting on replans breaks that by far (the live step waits for at most one batched replan step; before
# the fix it waited for whole queues of replans, gaps of 3.5 to 11.4 s). "Published" is what this process
# also received from the sensor: a sensor descheduled on 2 cores publishes nothing for a while, and that is
# no gap of the node's. On this process's receive clock, DDS delivery and the scheduling of three processes
# on 2 cores add their own pauses (175 ms at a load average of 9; once 346 ms on Jazzy's Fast DDS with
# every observation stepped on time), so that bound is 1 s: still 3.5x below the smallest starvation gap
# the issue measured.
MAX_UNSTEPPED_IN_A_ROW = 4  # 3 periods plus 2 of scheduling jitter on 2 cores: the old 50 ms stamp bound
MAX_RECEIVE_GAP_S = 1.0


def unstepped_runs(published_ns, stepped_ns) -> list:
    """For each pair of consecutive stepped stamps, how many published stamps fell strictly between them."""
    published = np.sort(np.asarray(published_ns, np.int64))
    stepped = np.asarray(stepped_ns, np.int64)
    return list(np.searchsorted(published, stepped[1:]) - np.searchsorted(published, stepped[:-1], side="right"))


def test_unstepped_runs_count_the_published_observations_between_two_steps():
    assert unstepped_runs([10, 20, 30, 40, 50], [10, 20, 50]) == [0, 2]
    assert unstepped_runs([10, 20, 30, 40, 50, 60], [10, 60]) == [4]


# The robot's configuration: the compiled CPU backend, whose kernels release the GIL (the NumPy reference
# backend's step and replan share it: on an AVX2-only EPYC its step took 6-7 ms beside a replan, and the loop kept
# 75-80 % of the observations whatever the clients' priority). The planners run at nice 10, as bulk clients on a
# robot's computer run below its control loop: at equal priority, on 2 cores, the three of them and this test's
# process took ~100 % of a core between them, and the node's stepping thread waited its turn behind them (82-90 %
# stepped, node at 70 % CPU); niced, 597-600 of 600. Starvation inside the node (the live step queued behind
# whole replans) shows as unstepped runs of seconds either way.
@pytest.mark.parametrize("node_params", [{"observation_reliable": False, "capsule_capacity": 400, "backend": "cpu"}])
def test_three_clients_replanning_back_to_back_do_not_starve_the_100hz_control_loop(flashrt, ros_domain):
    import json

    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from ros_harness import stamp_ns
    from sensor_msgs.msg import JointState

    from flashrt_interfaces.msg import PolicyStep
    proc, planner = flashrt
    received = []  # (receive time, step message)
    planner.node.create_subscription(PolicyStep, "/test/policy_step", lambda m: received.append((time.monotonic(), m)),
                                     QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    published = []  # observation stamps, ns, as this process received them from the sensor
    planner.node.create_subscription(JointState, "/test/observation",
                                     lambda m: published.append(stamp_ns(m)),
                                     QoSProfile(depth=1000, reliability=qos_profile_sensor_data.reliability))
    clients = [subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", CLIENT, f"planner{i}", str(STREAM_S + 2.0)],
                                env=ros_domain,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
    try:
        for c in clients:
            assert c.stdout.readline().strip() == "ready"
        planner.spin(0.5)  # the clients are replanning back to back now
        sensor = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.demo.sensor_sim", "--rate", str(RATE_HZ),
                                   "--duration", str(STREAM_S), "--namespace", "/test", "--subscribers", "2"],
                                  env=ros_domain,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        end = time.monotonic() + STREAM_S + 30.0
        while sensor.poll() is None and time.monotonic() < end:  # receive times are taken as they come
            planner.spin(0.05)
        sensor_out = sensor.communicate(timeout=10)[0]
        # the node's last steps, however late a loaded machine lets them come (a fixed wait here was too short)
        planner.spin_until(lambda: bool(received) and bool(published)
                           and stamp_ns(received[-1][1]) >= published[-1])
        planner.spin(0.3)
        counts = [json.loads(c.communicate(timeout=30)[0].strip().splitlines()[-1]) for c in clients]
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
    sent = int(sensor_out.split("sent")[-1])
    assert sensor.returncode == 0 and sent >= 0.9 * RATE_HZ * STREAM_S, sensor_out
    # all three got replans through; the others were told busy (at most one runs), nothing else failed
    assert all(c["ran"] > 0 and c["busy"] > 0 and c["other"] == 0 for c in counts), counts
    stepped = len(received)
    stepped_ns = [stamp_ns(m) for _, m in received]
    receive_gaps = np.diff([t for t, _ in received])
    assert stepped >= 0.95 * sent, f"only {stepped} of {sent} observations stepped; replans: {counts}"
    assert (np.diff(stepped_ns) > 0).all(), "policy_steps out of observation order"
    assert len(published) >= 0.9 * sent, f"this process received {len(published)} of {sent} observations"
    runs = unstepped_runs(published, stepped_ns)
    assert max(runs) <= MAX_UNSTEPPED_IN_A_ROW, \
        f"{max(runs)} published observations in a row were not stepped; replans: {counts}"
    assert receive_gaps.max() < MAX_RECEIVE_GAP_S, \
        f"largest receive gap {receive_gaps.max() * 1e3:.0f} ms; replans: {counts}"
    out = proc.output()
    assert "Traceback" not in out and "[ERROR]" not in out, out[-3000:]
