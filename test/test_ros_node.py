"""The flashrt node over DDS: a real node process, a real planner node, real messages."""
import hashlib

import numpy as np
import pytest
from ros_harness import joint_state

from conftest import observation_trace

pytestmark = pytest.mark.ros


def test_each_observation_steps_once_in_order_with_increasing_capsules(flashrt):
    _, planner = flashrt
    obs = observation_trace(40)
    planner.run(obs)
    steps = planner.steps
    assert [m.step for m in steps] == list(range(1, 41))
    ids = [m.capsule_id for m in steps]
    assert all(b > a for a, b in zip(ids, ids[1:]))
    assert all(len(m.action) == 7 and len(m.action_chunk) == 8 * 7 and m.chunk_len == 8 for m in steps)
    assert steps[5].header.stamp.nanosec != steps[6].header.stamp.nanosec  # stamps come from the observations


def test_rollback_by_id_and_by_steps_back_reproduces_actions_bitwise(flashrt):
    _, planner = flashrt
    obs = observation_trace(60)
    first = planner.run(obs[:50])
    cid = planner.steps[29].capsule_id  # state after 30 steps
    r = planner.client.rollback(capsule_id=cid)
    assert r.success and r.capsule.step == 30 and r.elapsed_ms > 0
    assert planner.run(obs[30:50]).tobytes() == first[30:].tobytes()
    r = planner.client.rollback(steps_back=15)
    assert r.success and r.capsule.step == 35, r.message
    assert planner.run(obs[35:50]).tobytes() == first[35:].tobytes()


def _live_sha(planner, name):
    snap = planner.client.snapshot(label=name)
    assert snap.success
    exp = planner.client.call("export_capsule", capsule_id=snap.capsule.id, file_name=f"{name}.safetensors")
    assert exp.success, exp.message
    return exp.sha256


def test_whatif_replan_leaves_live_state_and_capsule_unchanged(flashrt):
    _, planner = flashrt
    obs = observation_trace(40)
    planner.run(obs[:20])
    live_before = planner.client.call("list_capsules").live_capsule_id
    sha_before = _live_sha(planner, "before")
    out = planner.client.replan(np.stack([obs[20:28]] * 4), capsule_id=live_before - 5)
    assert out.accepted and out.result.success and out.result.deadline_met, out.result.message
    assert len(out.result.actions) == 4 * 8 * 7 and len(out.result.branch_capsule_ids) == 4
    assert _live_sha(planner, "after") == sha_before
    # and the branch is exactly what the robot would do from that capsule
    planner.client.rollback(capsule_id=live_before - 5)
    assert planner.run(obs[20:28]).tobytes() == out.actions(4, 7)[2].tobytes()


def test_commit_replan_makes_the_branch_live(flashrt):
    _, planner = flashrt
    obs = observation_trace(40)
    planner.run(obs[:20])
    branches = np.stack([obs[20:26], obs[30:36]])
    out = planner.client.replan(branches, commit_branch=1)
    assert out.result.success and out.result.live_capsule_id == out.result.branch_capsule_ids[1]
    nxt = planner.step(obs[36])
    assert nxt.step == 27
    lst = planner.client.call("list_capsules")
    assert next(c for c in lst.capsules if c.id == nxt.capsule_id).parent_id == out.result.branch_capsule_ids[1]


def test_replan_deadline_of_1ms_returns_a_partial_result(flashrt):
    _, planner = flashrt
    planner.run(observation_trace(10))
    out = planner.client.replan(np.repeat(observation_trace(300)[None], 8, axis=0), deadline_ms=1.0)
    assert out.accepted and out.result.success and not out.result.deadline_met
    assert "deadline" in out.result.message
    assert 0 < len(out.result.actions) < 8 * 300 * 7 and len(out.result.actions) % (8 * 7) == 0


def test_bad_requests_fail_cleanly_and_the_node_keeps_serving(flashrt, tmp_path):
    proc, planner = flashrt
    obs = observation_trace(30)
    planner.run(obs[:10])
    sha = _live_sha(planner, "ref")
    bad = [
        planner.client.rollback(capsule_id=99999),
        planner.client.rollback(steps_back=500),
        planner.client.call("drop_capsule", capsule_id=424242),
        planner.client.call("export_capsule", capsule_id=1, file_name="../escape.safetensors"),
        planner.client.call("export_capsule", capsule_id=1, file_name="/tmp/abs.safetensors"),
        planner.client.call("import_capsule", file_name="missing.safetensors", restore=True),
    ]
    (tmp_path / "capsules" / "corrupt.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    bad.append(planner.client.call("import_capsule", file_name="corrupt.safetensors", restore=True))
    for r in bad:
        assert not r.success and len(r.message) > 10, r
    assert "unknown capsule" in bad[0].message and ".." in bad[3].message and "relative" in bad[4].message
    # malformed goals are rejected by the goal callback
    from flashrt_interfaces.action import Replan
    for goal in (Replan.Goal(branches=2, horizon=3, observations=[0.0] * 5),
                 Replan.Goal(branches=99, horizon=1, observations=[0.0] * 99 * 14),
                 Replan.Goal(branches=1, horizon=1, observations=[0.0] * 14, commit_branch=3),
                 Replan.Goal(branches=1, horizon=1, observations=[float("nan")] * 14),
                 Replan.Goal(capsule_id=777777, branches=1, horizon=1, observations=[0.0] * 14)):
        assert not planner.client.send_goal(goal).accepted
    # bad observations are rejected and counted, the state is untouched
    n = len(planner.steps)
    wrong = joint_state(obs[10], 5)
    wrong.position = wrong.position[:5]
    nan = joint_state(obs[10], 6)
    nan.velocity[2] = float("nan")
    for m in (wrong, nan):
        planner.publish(m)
    planner.spin(0.5)
    assert len(planner.steps) == n
    assert _live_sha(planner, "ref2") == sha
    assert planner.step(obs[10]).step == 11  # still serving
    out = proc.output()
    assert "observation rejected" in out and "replan goal rejected" in out


def test_export_import_round_trip_over_ros(flashrt, tmp_path):
    _, planner = flashrt
    obs = observation_trace(30)
    first = planner.run(obs[:20])
    cid = planner.steps[9].capsule_id
    exp = planner.client.call("export_capsule", capsule_id=cid, file_name="sub/ten.safetensors")
    assert exp.success
    data = (tmp_path / "capsules" / "sub" / "ten.safetensors").read_bytes()
    assert len(data) > 1000 and len(exp.sha256) == 64
    imp = planner.client.call("import_capsule", file_name="sub/ten.safetensors", restore=True)
    assert imp.success and imp.capsule.step == 10
    assert planner.run(obs[10:20]).tobytes() == first[10:].tobytes()
    assert hashlib.sha256(data).hexdigest() != exp.sha256  # the checksum covers the state bytes, not the file


def test_sizes_are_read_only_while_configured_and_diagnostics_report(flashrt):
    from diagnostic_msgs.msg import DiagnosticArray
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    _, planner = flashrt
    diags = []
    planner.node.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
    planner.run(observation_trace(5))
    cli = planner.node.create_client(SetParameters, "/test/flashrt/set_parameters")
    assert cli.wait_for_service(timeout_sec=10)

    def set_param(name, value):
        v = (ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value) if isinstance(value, int)
             else ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value))
        req = SetParameters.Request(parameters=[Parameter(name=name, value=v)])
        return planner.client._spin_until(cli.call_async(req), 10).results[0]

    frozen = set_param("kv_window", 64)
    assert not frozen.successful and "read-only while configured" in frozen.reason
    assert set_param("replan_deadline_ms", 30.0).successful
    planner.spin(1.5)
    status = next(s for d in diags for s in d.status if s.name.endswith("flashrt: runtime"))
    values = {kv.key: kv.value for kv in status.values}
    assert int(values["steps"]) == 5 and float(values["step_latency_p99_ms"]) > 0
    assert {"rejected_inputs", "held_observations", "capsules_used", "capsule_budget_bytes",
            "step_deadline_misses"} <= set(values)
