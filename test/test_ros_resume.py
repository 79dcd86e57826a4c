"""Crash-resume through ROS: a node killed with SIGKILL at random moments while it steps at 100 Hz, 20 times,
comes back with resume on and continues byte-identically to a node that never crashed."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros

KILLS = 20
PERIOD_S = 0.01  # 100 Hz
MAX_LOST = 10  # records still queued when the kill lands; the writer drains the queue within a step or two


def test_a_node_killed_20_times_resumes_each_time_at_its_last_record_and_continues_byte_exactly(ros_domain, tmp_path):
    from ros_harness import NodeProcess, Planner, reference_session

    from flashrt_ros.runtime.capsule_file import state_digest
    from flashrt_ros.runtime.persistence import resume

    persist = tmp_path / "persist"
    params = dict(persist_dir=str(persist), resume=True, capsule_dir=str(tmp_path / "capsules"))
    obs = observation_trace(4000)
    reference = reference_session()  # the node that never crashed: fed what the node stepped
    rng = np.random.default_rng(11)
    planner = None
    fed = 0  # observations on the node's timeline: answered before the kill, or after the resume
    expected = None  # (step, state sha256) of the last record in the log, read after the kill
    lost_counts = []
    if True:
        for kill in range(KILLS + 1):
            # a namespace per run: the killed node's endpoints linger in DDS discovery until its lease ends
            ns = f"/run{kill}"
            proc = NodeProcess(ros_domain, tmp_path / f"node{kill}.log", namespace=ns, **params)
            try:
                planner = Planner(namespace=ns, name=f"planner{kill}")
                planner.wait_ready(60.0)
                listing = planner.client.list_capsules()
                resumed_step = next((c.step for c in listing.capsules if c.id == listing.live_capsule_id), 0)
                if expected is not None:
                    step, digest = expected
                    assert resumed_step == step, (kill, resumed_step, step)
                    assert listing.resumed_from and all(c.resumed for c in listing.capsules), listing.resumed_from
                    out = planner.client.export_capsule(f"live{kill}.safetensors")
                    assert out.success and out.sha256 == digest, (kill, out.message)  # the last persisted capsule
                    if resumed_step == fed + 1:  # the observation in flight was stepped and persisted, unanswered
                        reference.step(obs[fed])
                        fed += 1
                    lost = fed - resumed_step  # answered steps whose record was still queued at the kill
                    assert 0 <= lost <= MAX_LOST, (kill, fed, resumed_step)
                    lost_counts.append(lost)
                    reference.rollback(steps_back=reference.step_count - resumed_step)
                    assert state_digest(reference.materialize(reference.live_capsule_id)) == digest
                fed = resumed_step
                # step at 100 Hz; the kill lands at a random moment, between or during steps
                n = int(rng.integers(20, 60))
                timer = threading.Timer(rng.uniform(0.3, 0.9) * n * PERIOD_S,
                                        lambda p=proc.proc: os.kill(p.pid, signal.SIGKILL))
                timer.start() if kill < KILLS else None
                for o in obs[fed:fed + n]:
                    t0 = time.monotonic()
                    try:
                        got = planner.step(o, timeout=2.0 if kill < KILLS else 10.0)
                    except TimeoutError:
                        break  # killed
                    want = reference.step(o)
                    assert np.asarray(got.action, np.float32).tobytes() == want.action.tobytes(), (kill, fed)
                    fed += 1
                    time.sleep(max(0.0, PERIOD_S - (time.monotonic() - t0)))
                timer.cancel()
                if kill < KILLS:
                    proc.proc.wait(10)
                    assert proc.proc.returncode == -signal.SIGKILL
                    probe = reference_session()  # what the log holds now, read as the next node will
                    report = resume(probe, persist)
                    assert report.step > 0, "nothing persisted before the kill"
                    expected = (report.step, state_digest(probe.materialize(report.capsule_id)))
            finally:
                if planner is not None:
                    planner.close()
                proc.stop()
                out = proc.output()
                assert "Traceback" not in out, out[-3000:]
    assert len(lost_counts) == KILLS
    print(f"records lost per kill: max {max(lost_counts)}, mean {np.mean(lost_counts):.2f}")


def test_a_log_of_another_fingerprint_fails_configure_unless_the_user_asks_to_start_fresh(ros_domain, tmp_path):
    from ros_harness import Diagnostics, NodeProcess, Planner, reference_session

    from flashrt_ros.runtime.persist import PersistSettings

    persist = tmp_path / "persist"
    other = reference_session(seed=7)  # other weights: another fingerprint
    other.enable_persistence(PersistSettings(persist))
    for o in observation_trace(20):
        other.step(o)
    other.disable_persistence()
    old_files = sorted(p.name for p in persist.iterdir())
    refused = NodeProcess(ros_domain, tmp_path / "refused.log", persist_dir=str(persist), resume=True)
    refused.proc.wait(60)
    refused.stop()
    out = refused.output()
    assert refused.proc.returncode in (1, 2) and "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if "configure failed" in ln and "another config, weights or plan" in ln
            and "resume_fresh_on_mismatch" in ln], out
    assert sorted(p.name for p in persist.iterdir()) == old_files  # nothing touched

    fresh = NodeProcess(ros_domain, tmp_path / "fresh.log", persist_dir=str(persist), resume=True,
                        resume_fresh_on_mismatch=True)
    planner = Planner()
    diagnostics = Diagnostics(planner)
    try:
        planner.wait_ready(60.0)
        for o in observation_trace(5):
            planner.step(o)
        listing = planner.client.list_capsules()
        assert listing.resumed_from == "" and not any(c.resumed for c in listing.capsules)
        assert listing.capsules[0].id == 1  # the old log went aside: this is a fresh one
        _, values = diagnostics.until(lambda v: int(v.get("persist_records_written", 0)) == 5)
        assert values["persist_records_dropped"] == "0" and int(values["persist_segments"]) == 1
    finally:
        planner.close()
        assert fresh.stop() == 0
    stale = [d for d in persist.iterdir() if d.name.startswith("stale-")]
    assert len(stale) == 1 and sorted(p.name for p in stale[0].iterdir()) == old_files  # moved, not deleted
    assert "moved to" in fresh.output()
