"""A replica over DDS (issue 18, point 2): a primary and a replica node in their own processes. The replica
rebuilds the primary's capsules from ~/capsule_stream byte for byte, serves list/export and what-if replans
that match the primary's bytes, refuses what would change the robot's state (naming the primary), and a
replica of another fingerprint refuses every record without touching its store."""
from __future__ import annotations

import time

import numpy as np
import pytest
from ros_harness import export_content, primary_and

from conftest import observation_trace

pytestmark = pytest.mark.ros

OBS = observation_trace(200)
# what-ifs here judge bytes, not time: whole results whatever a loaded machine's stalls (both nodes' cap raised)
LONG_DEADLINE_MS = 60_000.0


def _wait(cond, timeout: float, planner, what: str):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(what)
        planner.spin(0.05)


def _capsules(client):
    res = client.list_capsules()
    assert res.success, res.message
    return {c.id: c for c in res.capsules}


@pytest.fixture
def primary_and_replica(ros_domain, tmp_path):
    primary, replica, planner, remote = primary_and("replica", ros_domain, tmp_path, "/ws",
                                                  {"replan_max_deadline_ms": LONG_DEADLINE_MS},
                                                  replan_max_deadline_ms=LONG_DEADLINE_MS)
    try:
        yield planner, remote, primary, replica
    finally:
        planner.close()
        outs = []
        for proc in (primary, replica):
            rc = proc.stop()
            outs.append((rc, proc.output()))
        for rc, out in outs:
            assert "Traceback" not in out, out[-3000:]
            assert rc == 0, out[-3000:]


def test_a_replica_holds_the_primarys_capsules_and_its_what_ifs_match_byte_for_byte(primary_and_replica, tmp_path):
    planner, remote, primary, replica = primary_and_replica
    # the first record may go out before the primary's publisher matched the replica (a loaded CI machine took
    # 14 steps): the replica then resyncs to the live capsule, and every record after that link is the contract
    planner.run(OBS[:1])
    first = planner.steps[-1].capsule_id
    _wait(lambda: first in _capsules(remote), 20.0, planner, "the replica never held the first capsule")
    planner.run(OBS[1:40])
    live = planner.steps[-1].capsule_id
    _wait(lambda: live in _capsules(remote), 15.0, planner, "the replica never held the live capsule")
    mine, theirs = _capsules(remote), _capsules(planner.client)
    streamed = {s.capsule_id for s in planner.steps[1:]}
    assert set(mine) <= set(theirs) and len(streamed & set(mine)) >= 30, (sorted(mine), sorted(streamed))
    for cid in list(mine)[-5:]:
        a = remote.export_capsule(f"r{cid}.safetensors", cid)
        b = planner.client.export_capsule(f"p{cid}.safetensors", cid)
        assert a.success and b.success, (a.message, b.message)
        got = export_content(tmp_path / "replica_caps" / f"r{cid}.safetensors")
        want = export_content(tmp_path / "primary_caps" / f"p{cid}.safetensors")
        assert got == want, f"capsule {cid}: the replica's export differs from the primary's"
    base = list(mine)[-10]
    plan = np.stack([OBS[100:106] + 0.1 * b for b in range(3)])
    a = remote.replan(plan, capsule_id=base, deadline_ms=LONG_DEADLINE_MS)
    b = planner.client.replan(plan, capsule_id=base, deadline_ms=LONG_DEADLINE_MS)
    assert a.succeeded and b.succeeded, (a.reason, b.reason)
    assert a.actions().tobytes() == b.actions().tobytes()

    # what would change the robot's state is refused, naming the primary; the replica is unchanged
    for res in (remote.snapshot(label="x"), remote.rollback(steps_back=2), remote.reset(),
                remote.drop_capsule(base)):
        assert not res.success and "replica of /robot1/flashrt" in res.message, res.message
    assert set(_capsules(remote)) >= set(mine)

    # a commit sent to the replica: the primary re-runs that branch from the same capsule and commits it
    out = remote.replan(plan, capsule_id=base, commit_branch=1, deadline_ms=LONG_DEADLINE_MS)
    assert out.succeeded and "committed on /robot1/flashrt" in out.result.message, out.result.message
    assert "byte-identical" in out.result.message
    assert out.actions().tobytes() == b.actions().tobytes()  # the replica's what-if of every branch
    live = _capsules(planner.client)[out.result.live_capsule_id]
    assert live.step == _capsules(planner.client)[base].step + 6
    follow = planner.step(OBS[110])  # the primary continues from the committed branch
    ref_primary = planner.client.replan(np.stack([OBS[110:111]]), capsule_id=out.result.live_capsule_id)
    assert np.asarray(follow.action, np.float32).tobytes() == ref_primary.actions()[0, 0].tobytes()

    # the stream follows a rollback and more steps on the primary
    back = planner.client.rollback(steps_back=5)
    assert back.success, back.message
    planner.run(OBS[40:50])
    live = planner.steps[-1].capsule_id
    _wait(lambda: live in _capsules(remote), 15.0, planner, "the replica stopped following after a rollback")
    a = remote.export_capsule("r_after.safetensors", live)
    b = planner.client.export_capsule("p_after.safetensors", live)
    assert a.success and b.success
    assert export_content(tmp_path / "replica_caps" / "r_after.safetensors") == \
        export_content(tmp_path / "primary_caps" / "p_after.safetensors")


def test_a_replica_of_another_fingerprint_refuses_every_record_and_holds_nothing(ros_domain, tmp_path):
    primary, replica, planner, remote = primary_and("replica", ros_domain, tmp_path, "/ws", {"stream_keyframe_s": 0.5},
                                                    primary="/robot1/flashrt", seed=7)
    try:
        planner.run(OBS[:30])
        _wait(lambda: "refused" in replica.output() and "fingerprint" in replica.output(), 15.0, planner,
              "the replica never said it refused a record")
        assert _capsules(remote) == {}
        # a commit through it has nothing to start from: its row 0 is not the primary's live state
        live = planner.steps[-1].capsule_id
        out = remote.replan(np.stack([OBS[30:33]]), commit_branch=0, deadline_ms=200.0)
        assert out.result.rejected and "holds no capsule of the primary's timeline" in out.result.message, \
            out.result.message
        assert planner.client.list_capsules().live_capsule_id == live  # nothing was committed on the primary
    finally:
        planner.close()
        assert primary.stop() == 0 and replica.stop() == 0, replica.output()[-3000:]


def test_a_replica_started_after_the_primary_stepped_catches_up_by_resync_not_the_next_keyframe(ros_domain, tmp_path):
    from ros_harness import NodeProcess, Planner

    from flashrt_ros.ros.client import FlashRTClient
    primary = NodeProcess(ros_domain, tmp_path / "primary.log", namespace="/robot1", stream_keyframe_s=3600.0,
                          capsule_dir=str(tmp_path / "pc"))
    planner = Planner(namespace="/robot1")
    replica = None
    try:
        planner.wait_ready()
        planner.run(OBS[:20])
        replica = NodeProcess(ros_domain, tmp_path / "replica.log", namespace="/ws", role="replica",
                              primary="/robot1", capsule_dir=str(tmp_path / "rc"))
        remote = FlashRTClient(planner.node, "/ws")
        remote.wait_until_ready(30.0)
        # the robot stands still: only a resync (asked for on a timer while it waits) can bring the state
        _wait(lambda: planner.steps[-1].capsule_id in _capsules(remote), 20.0, planner,
              "the late replica never caught up with an idle primary")
        planner.run(OBS[20:25])  # and it follows the steps after
        _wait(lambda: planner.steps[-1].capsule_id in _capsules(remote), 10.0, planner, "it stopped following")
    finally:
        planner.close()
        assert primary.stop() == 0 and (replica is None or replica.stop() == 0)


def test_a_primary_restarted_without_persist_dir_is_a_new_run_for_its_replica(ros_domain, tmp_path):
    """The restarted primary numbers its capsules from 1 again: the replica drops the old run's capsules at the
    new run's keyframe instead of serving the old capsule 5 as the new one."""
    from ros_harness import NodeProcess, Planner

    from flashrt_ros.ros.client import FlashRTClient
    args = dict(namespace="/robot1", stream_keyframe_s=3600.0, capsule_dir=str(tmp_path / "pc"))
    primary = NodeProcess(ros_domain, tmp_path / "primary.log", **args)
    planner = Planner(namespace="/robot1")
    replica = None
    try:
        planner.wait_ready()
        replica = NodeProcess(ros_domain, tmp_path / "replica.log", namespace="/ws", role="replica",
                              primary="/robot1", capsule_dir=str(tmp_path / "rc"))
        remote = FlashRTClient(planner.node, "/ws")
        remote.wait_until_ready(30.0)
        planner.run(OBS[:30])
        _wait(lambda: planner.steps[-1].capsule_id in _capsules(remote), 20.0, planner, "the replica never caught up")
        assert primary.stop() == 0
        primary = NodeProcess(ros_domain, tmp_path / "primary2.log", **args)
        planner.wait_ready()
        # the robot goes on stepping (the records sent before the replica matched the new publisher are lost)
        for o in OBS[100:190]:
            planner.run(o[None])
            planner.spin(0.05)
            if "streams another run" in replica.output():
                break
        _wait(lambda: "streams another run" in replica.output(), 10.0, planner, "the replica never saw the new run")
        live = planner.steps[-1].capsule_id
        assert live < 100, "the restarted primary should number from 1 again"
        _wait(lambda: live in _capsules(remote), 20.0, planner, "the replica never followed the new run")
        # every capsule the replica lists is the new run's: same id, same step and stamp as the primary's
        mine, theirs = _capsules(remote), _capsules(planner.client)
        assert set(mine) <= set(theirs)
        for cid, c in mine.items():
            assert (c.step, c.stamp.sec, c.stamp.nanosec) == (theirs[cid].step, theirs[cid].stamp.sec,
                                                             theirs[cid].stamp.nanosec), cid
        a = remote.export_capsule("r.safetensors", live)
        b = planner.client.export_capsule("p.safetensors", live)
        assert a.success and b.success, (a.message, b.message)
        assert export_content(tmp_path / "rc" / "r.safetensors") == export_content(tmp_path / "pc" / "p.safetensors")
    finally:
        planner.close()
        assert primary.stop() == 0 and (replica is None or replica.stop() == 0)
