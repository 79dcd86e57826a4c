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


def _step_unless_killed(planner, proc, obs, timeout: float):
    """planner.step, ending the wait soon after the node is seen dead instead of at the timeout."""
    return planner.step(obs, timeout, dead=lambda: proc.proc.poll() is not None)


def test_a_node_killed_20_times_resumes_each_time_at_its_last_record_and_continues_byte_exactly(ros_domain, tmp_path):
    from ros_harness import NodeProcess, Planner, reference_session

    from flashrt_ros.runtime.persist.attach import resume
    from flashrt_ros.runtime.state.capsule_file import state_digest

    persist = tmp_path / "persist"
    params = dict(persist_dir=str(persist), resume=True, capsule_dir=str(tmp_path / "capsules"))
    obs = observation_trace(4000)
    reference = reference_session()  # the node that never crashed: fed what the node stepped
    rng = np.random.default_rng(11)
    planner = None
    fed = 0  # observations on the node's timeline: answered before the kill, or after the resume
    expected = None  # (step, state sha256) of the last record in the log, read after the kill
    lost_counts = []
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
            # step at 100 Hz; the kill lands at a random moment, between or during steps, armed at the run's first
            # answer (armed before it, a new node's first step, slow on a loaded machine, was killed with nothing
            # persisted once in CI)
            n = int(rng.integers(20, 60))
            timer = threading.Timer(rng.uniform(0.3, 0.9) * (n - 1) * PERIOD_S,
                                    lambda p=proc.proc: os.kill(p.pid, signal.SIGKILL))
            for i, o in enumerate(obs[fed:fed + n]):
                t0 = time.monotonic()
                try:
                    got = _step_unless_killed(planner, proc, o, timeout=2.0 if kill < KILLS and i else 10.0)
                except TimeoutError:
                    break  # killed
                if i == 0 and kill < KILLS:
                    timer.start()
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
                if report.step == 0 and kill == 0:
                    # killed before its writer's first record (a starved writer on a loaded machine): what it
                    # answered is lost, within the bound, and the next node starts afresh
                    assert fed <= MAX_LOST, (kill, fed)
                    lost_counts.append(fed)
                    reference, expected = reference_session(), None
                    continue
                assert report.step > 0, f"kill {kill}: nothing persisted before it ({fed} steps answered)"
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

    from flashrt_ros.runtime.persist.writer import PersistSettings

    persist = tmp_path / "persist"
    other = reference_session(seed=7)  # other weights: another fingerprint
    other.enable_persistence(PersistSettings(persist))
    for o in observation_trace(20):
        other.step(o)
    other.disable_persistence()
    from flashrt_ros.runtime.persist.format import IDS_NAME, TIMELINE_NAME, read_id_limit

    old_files = sorted(p.name for p in persist.iterdir())
    # the id reservation stays (ids never repeat); the timeline file is rewritten for the fresh run
    old_log = [name for name in old_files if name not in (IDS_NAME, TIMELINE_NAME)]
    reserved = read_id_limit(persist)
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
        assert listing.capsules[0].id == reserved  # the old log went aside; its ids are still never reused
        _, values = diagnostics.until(lambda v: int(v.get("persist_records_written", 0)) == 5)
        assert values["persist_records_dropped"] == "0" and int(values["persist_segments"]) == 1
    finally:
        planner.close()
        assert fresh.stop() == 0
    stale = [d for d in persist.iterdir() if d.name.startswith("stale-")]
    assert len(stale) == 1 and sorted(p.name for p in stale[0].iterdir()) == old_log  # moved, not deleted
    assert "moved to" in fresh.output()


def _log_records(persist, probe):
    """Every valid record in the node's log right now (a record being written is left out)."""
    from flashrt_ros.runtime.persist.attach import layout_of
    from flashrt_ros.runtime.persist.format import LogCorrupt, iter_segment_paths, scan
    from flashrt_ros.runtime.persist.resume import meta_reader

    out = []
    for seg in iter_segment_paths(persist):
        try:
            out += scan(seg, seg.read_bytes(), layout_of(probe), meta_reader(probe.arena))[0]
        except LogCorrupt:  # a segment the writer is creating: its header is not written yet
            continue
    return out


def _until_logged(persist, probe, pred, what: str, timeout: float = 30.0):
    """Wait for the node's writer to put a record that satisfies ``pred`` on disk (a kill -9 after that
    cannot lose it: the page cache outlives the process)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(pred(r) for r in _log_records(persist, probe)):
            return
        time.sleep(0.05)
    raise AssertionError(f"the node never logged {what}")


def _kill(proc) -> None:
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(10)
    assert proc.proc.returncode == -signal.SIGKILL


def test_reset_rollback_after_resume_and_old_ids_survive_kill_9(ros_domain, tmp_path):
    """Issue 15, items 2.2, 2.4 and 2.5 through the node: a /reset, then kill -9, resumes reset; a what-if's
    id from before the crash is refused, never answered with another state; a rollback made right after a
    resume, before any observation, survives the next kill -9; no id is handed out twice."""
    from ros_harness import NodeProcess, Planner, reference_session

    from flashrt_ros.runtime.persist.format import LIVE, RESET

    persist = tmp_path / "persist"
    params = dict(persist_dir=str(persist), resume=True)
    obs = observation_trace(80)
    probe = reference_session()
    reference = reference_session()

    def start(run):
        proc = NodeProcess(ros_domain, tmp_path / f"node{run}.log", namespace=f"/run{run}", **params)
        planner = Planner(namespace=f"/run{run}", name=f"planner{run}")
        planner.wait_ready(60.0)
        return proc, planner

    proc, planner = start(0)
    try:
        for o in obs[:30]:
            planner.step(o)
            reference.step(o)
        what_if = planner.client.replan(np.stack([obs[30:33], obs[30:33] * 0.5]), timeout_s=60.0)
        what_if = what_if.result.branch_capsule_ids
        assert len(what_if) == 2
        seen = {c.id for c in planner.client.list_capsules(timeout_s=30.0).capsules} | set(what_if)
        assert planner.client.reset(timeout_s=30.0).success
        _until_logged(persist, probe, lambda r: r.kind == RESET, "the reset")
        _kill(proc)
    finally:
        planner.close()
        proc.stop()

    proc, planner = start(1)
    try:
        listing = planner.client.list_capsules(timeout_s=30.0)
        assert listing.live_capsule_id == 0 and len(listing.capsules) == 30  # reset, capsules kept
        assert listing.resumed_from and all(c.resumed for c in listing.capsules)
        for cid in what_if:  # before: success, and another state than the what-if's
            out = planner.client.rollback(cid, timeout_s=30.0)
            assert not out.success and "evicted or dropped" in out.message, out.message
        back = planner.client.rollback(20, timeout_s=30.0)  # right after the resume: nothing written by this run yet
        assert back.success, back.message
        _until_logged(persist, probe, lambda r: r.kind == LIVE and r.id == 20, "the rollback's marker")
        _kill(proc)
    finally:
        planner.close()
        proc.stop()

    proc, planner = start(2)
    try:
        listing = planner.client.list_capsules(timeout_s=30.0)
        live = next(c for c in listing.capsules if c.id == listing.live_capsule_id)
        assert (live.id, live.step) == (20, 20)
        reference.rollback(20)
        got = planner.step(obs[50])
        assert np.asarray(got.action, np.float32).tobytes() == reference.step(obs[50]).action.tobytes()
        assert got.capsule_id > max(seen)  # ids never reused across the crashes
    finally:
        planner.close()
        assert proc.stop() == 0
        for run in range(3):
            out = (tmp_path / f"node{run}.log").read_text()
            assert "Traceback" not in out, out[-3000:]


def test_a_node_that_ran_with_30_pins_comes_back_after_kill_9(ros_domain, tmp_path):
    """Issue 15, item 7.1: pins that shared their windows' pages in the running node, long out of the log's
    newest records (pin files only), fit the resumed store the same way: every restart used to exit 1."""
    from ros_harness import NodeProcess, Planner, reference_session

    persist = tmp_path / "persist"
    # a budget with 3 KV log pages beyond the 20 reserved: 30 pins fit only by sharing them
    params = dict(persist_dir=str(persist), resume=True, capsule_budget_mb=12.0, persist_segment_mb=5.0)
    probe = reference_session(capsule_budget_mb=12.0)
    obs = observation_trace(400)
    pins = list(range(11, 41))
    proc = NodeProcess(ros_domain, tmp_path / "node0.log", namespace="/pins0", **params)
    planner = Planner(namespace="/pins0", name="planner0")
    try:
        planner.wait_ready(60.0)
        for o in obs[:40]:
            planner.step(o)
        for cid in pins:
            out = planner.client.pin(cid, timeout_s=30.0)
            assert out.success, out.message
        for o in obs[40:400]:  # the pins' records fall behind what a resume reads: their pin files hold them
            planner.step(o)
        _until_logged(persist, probe, lambda r: r.step == 400, "the last step")
        _kill(proc)
    finally:
        planner.close()
        proc.stop()
    proc = NodeProcess(ros_domain, tmp_path / "node1.log", namespace="/pins1", **params)
    planner = Planner(namespace="/pins1", name="planner1")
    try:
        planner.wait_ready(60.0)
        listing = planner.client.list_capsules(timeout_s=30.0)
        assert [c.id for c in listing.capsules if c.pinned] == pins
        assert next(c.step for c in listing.capsules if c.id == listing.live_capsule_id) == 400
        for o in obs[:3]:
            planner.step(o)
    finally:
        planner.close()
        assert proc.stop() == 0
        out = proc.output()
        assert "Traceback" not in out and "ResumeDoesNotFit" not in out, out[-3000:]
