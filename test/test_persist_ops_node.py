"""Issue 15, 7.3 / 7.5 / 7.6 / 7.14 / 7.15 through a real node process: the persist_dir follows
capsule_dir's rules and never overlaps it, and a tiny queue, tiny segments and squatted segment names
still give a complete log."""
from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
from ros_harness import NodeProcess, Planner, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros

STEPS = 250  # FAST: ~18 KiB a record, so the raised 4 MiB segment rotates once


def test_a_node_with_a_tiny_queue_and_segments_and_squatted_names_persists_every_step(ros_domain, tmp_path):
    from flashrt_ros.runtime.persist.writer import PersistSettings

    persist = tmp_path / "made" / "by" / "node"
    proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"),
                       persist_dir=str(persist), persist_queue_mb=0.5, persist_segment_mb=1.0, persist_fsync_ms=0.0)
    planner = Planner()
    obs = observation_trace(STEPS)
    try:
        planner.wait_ready(60.0)
        # made by the node: private (7.5)
        assert stat.S_IMODE(persist.stat().st_mode) == 0o700
        # the next segment names, taken by a FIFO and a directory (7.15)
        os.mkfifo(persist / "seg-00000002.frl")
        (persist / "seg-00000003.frl").mkdir()
        got = planner.run(obs)
    finally:
        planner.close()
        rc = proc.stop()
    out = proc.output()
    assert rc == 0 and "Traceback" not in out, out[-3000:]
    # a whole-window record (1 MiB) is larger than the asked queue and segment: both were raised (7.3, 7.14)
    assert "persist_queue_mb 0.5 raised to" in out and "persist_segment_mb 1 raised to" in out, out[-3000:]
    segments = sorted(p.name for p in persist.glob("seg-*.frl") if p.is_file())
    assert segments == ["seg-00000001.frl", "seg-00000004.frl"], segments
    ref = reference_session()
    want = np.stack([ref.step(o).action for o in obs])
    assert got.tobytes() == want.tobytes()
    r = reference_session()
    report = r.enable_persistence(PersistSettings(persist, fsync_every_ms=0.0), resume=True)
    r.disable_persistence()
    assert report.step == STEPS and r.state_host().tobytes() == ref.state_host().tobytes()


def refused_starts(tmp_path) -> dict:
    """name: (params, the words the one error line must hold)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # past the umask
    both = str(tmp_path / "both")
    return {
        "owned_by_another_user": ({"persist_dir": str(theirs)}, "owned by uid 65534"),
        "writable_by_others": ({"persist_dir": str(shared)}, "writable by group or others"),
        "same_as_capsule_dir": ({"persist_dir": both, "capsule_dir": both}, "overlap"),
        "inside_capsule_dir": ({"persist_dir": both + "/log", "capsule_dir": both}, "overlap"),
        "around_capsule_dir": ({"persist_dir": both, "capsule_dir": both + "/files"}, "overlap"),
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root to make")
def test_an_untrusted_or_overlapping_persist_dir_fails_configure_with_one_line(ros_domain, tmp_path):
    cases = refused_starts(tmp_path)
    procs = {}
    try:
        for name, (params, _) in cases.items():
            params = {"capsule_dir": str(tmp_path / f"capsules_{name}"), **params}
            procs[name] = NodeProcess(ros_domain, tmp_path / f"{name}.log", namespace=f"/{name}", **params)
        end = time.monotonic() + 120
        while any(p.proc.poll() is None for p in procs.values()) and time.monotonic() < end:
            started = [n for n, p in procs.items() if "now active, stepping" in p.output()]
            assert not started, f"configured and serving: {started}"
            time.sleep(0.2)
    finally:
        for proc in procs.values():
            proc.stop()
    for name, proc in procs.items():
        out, want = proc.output(), cases[name][1]
        assert proc.proc.returncode in (1, 2) and "Traceback" not in out, (name, out[-3000:])
        errors = [ln for ln in out.splitlines() if "configure failed" in ln]
        assert len(errors) == 1 and want in errors[0], (name, out[-3000:])
    assert not list((tmp_path / "theirs").iterdir()) and not list((tmp_path / "shared").iterdir())


def test_a_set_pin_whose_file_would_not_fit_persist_budget_mb_is_refused_and_changes_nothing(ros_domain, tmp_path):
    from flashrt_ros.runtime.persist.attach import layout_of
    from flashrt_ros.runtime.persist.format import segment_header_bytes
    from flashrt_ros.runtime.persist.writer import MB, SEGMENT_MIN_RECORDS, whole_window_bytes

    layout = layout_of(reference_session())
    pin_mb = (len(segment_header_bytes(layout)) + whole_window_bytes(layout)) / MB
    segment_mb = round(SEGMENT_MIN_RECORDS * whole_window_bytes(layout) / MB + 0.1, 2)
    persist = tmp_path / "persist"
    proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"),
                       persist_dir=str(persist), persist_segment_mb=segment_mb,
                       persist_budget_mb=round(2 * segment_mb + 2.5 * pin_mb, 2))
    planner = Planner()
    try:
        planner.wait_ready(60.0)
        planner.run(observation_trace(20))
        assert planner.client.set_pin(3).success and planner.client.set_pin(6).success
        before = planner.client.list_capsules()
        r = planner.client.set_pin(9)
        assert not r.success and "persist_budget_mb" in r.message and "unpin" in r.message, r.message
        r = planner.client.snapshot(label="kept", pin=True)
        assert not r.success and "persist_budget_mb" in r.message, r.message
        after = planner.client.list_capsules()
        assert [(c.id, c.pinned) for c in after.capsules] == [(c.id, c.pinned) for c in before.capsules]
        assert after.live_capsule_id == before.live_capsule_id
    finally:
        planner.close()
        rc = proc.stop()
    assert rc == 0, proc.output()[-3000:]
    assert sorted(p.name for p in persist.glob("pin-*.frl")) == [f"pin-{c:016d}.frl" for c in (3, 6)]


def test_a_node_restarted_on_mismatched_logs_keeps_only_the_newest_moved_aside_logs(ros_domain, tmp_path):
    from flashrt_ros.runtime.persist.attach import STALE_KEEP
    from flashrt_ros.runtime.persist.writer import PersistSettings

    persist = tmp_path / "persist"
    for run in range(STALE_KEEP + 1):
        other = reference_session(seed=run + 1)  # another fingerprint than the node's
        other.enable_persistence(PersistSettings(persist, fsync_every_ms=0.0))
        other.step(observation_trace(1)[0])
        other.disable_persistence()
        proc = NodeProcess(ros_domain, tmp_path / f"node{run}.log", capsule_dir=str(tmp_path / "capsules"),
                           persist_dir=str(persist), resume=True, resume_fresh_on_mismatch=True)
        try:
            end = time.monotonic() + 120
            while "now active, stepping" not in proc.output() and proc.proc.poll() is None and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            rc = proc.stop()
        out = proc.output()
        assert rc == 0 and "moved to" in out, out[-3000:]
    assert len(list(persist.glob("stale-*"))) == STALE_KEEP
    assert "deleted stale-" in out and f"only the newest {STALE_KEEP}" in out, out[-3000:]
