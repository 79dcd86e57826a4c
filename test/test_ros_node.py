"""The flashrt node over DDS: a real node process, a real planner node, real messages."""
import hashlib
import time

import numpy as np
import pytest
from ros_harness import joint_state, stamp_ns

from conftest import observation_trace

pytestmark = pytest.mark.ros
# what-ifs here judge state, not time: a deadline no stall of a loaded machine reaches (the node's cap raised to it)
LONG_DEADLINE_MS = 60_000.0


@pytest.fixture
def node_params():
    return {"replan_max_deadline_ms": LONG_DEADLINE_MS}


def test_each_observation_steps_once_in_order_with_increasing_capsules(flashrt):
    _, planner = flashrt
    obs = observation_trace(40)
    first_stamp = planner.stamp
    planner.run(obs)
    steps = planner.steps
    assert [m.step for m in steps] == list(range(1, 41))
    ids = [m.capsule_id for m in steps]
    assert all(b > a for a, b in zip(ids, ids[1:]))
    assert all(len(m.action) == 7 and len(m.action_chunk) == 8 * 7 and m.chunk_len == 8 for m in steps)
    # each policy_step carries its observation's stamp exactly (not the time it was received)
    stamps = [stamp_ns(m) for m in steps]
    assert stamps == [first_stamp + 10_000_000 * (k + 1) for k in range(40)]


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
    branches = np.stack([obs[20:28] + 0.1 * b for b in range(4)]).astype(np.float32)  # four distinct what-ifs
    out = planner.client.replan(branches, capsule_id=live_before - 5, deadline_ms=LONG_DEADLINE_MS)
    assert out.accepted and out.result.success, out.result.message
    assert len(out.result.actions) == 4 * 8 * 7 and len(out.result.branch_capsule_ids) == 4
    assert _live_sha(planner, "after") == sha_before
    actions = out.actions(4, 7)
    assert len({actions[b].tobytes() for b in range(4)}) == 4
    # and each branch is exactly what the robot would do from that capsule with its observations
    for b in range(4):
        planner.client.rollback(capsule_id=live_before - 5)
        assert planner.run(branches[b]).tobytes() == actions[b].tobytes(), f"branch {b}"


def test_commit_replan_makes_the_branch_live(flashrt):
    _, planner = flashrt
    obs = observation_trace(40)
    planner.run(obs[:20])
    branches = np.stack([obs[20:26], obs[30:36]])
    out = planner.client.replan(branches, commit_branch=1, deadline_ms=LONG_DEADLINE_MS)
    assert out.result.success and out.result.deadline_met
    assert out.result.live_capsule_id == out.result.branch_capsule_ids[1]
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
    assert "unknown capsule" in bad[0].message and "'/'" in bad[3].message and "'/'" in bad[4].message
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
    exp = planner.client.call("export_capsule", capsule_id=cid, file_name="ten.safetensors")
    assert exp.success
    data = (tmp_path / "capsules" / "ten.safetensors").read_bytes()
    assert len(data) > 1000 and len(exp.sha256) == 64
    imp = planner.client.call("import_capsule", file_name="ten.safetensors", restore=True)
    assert imp.success and imp.capsule.step == 10
    assert planner.run(obs[10:20]).tobytes() == first[10:].tobytes()
    assert hashlib.sha256(data).hexdigest() != exp.sha256  # the checksum covers the state bytes, not the file


def test_sizes_are_read_only_and_diagnostics_report(flashrt):
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
    assert not frozen.successful and "read-only" in frozen.reason
    assert set_param("replan_deadline_ms", 30.0).successful
    end, values = time.monotonic() + 10, {}
    while values.get("steps") != "5" and time.monotonic() < end:  # an older status may arrive late
        planner.spin(0.1)
        status = next((s for d in diags[::-1] for s in d.status if s.name == "test/flashrt: runtime"), None)
        values = {kv.key: kv.value for kv in status.values} if status else {}
    assert int(values["steps"]) == 5 and float(values["step_latency_p99_ms"]) > 0
    assert {"rejected_inputs", "capsules_used", "capsule_budget_bytes",
            "step_deadline_misses"} <= set(values)


def test_without_joint_names_the_first_message_fixes_nothing_and_bad_joint_states_are_refused(flashrt):
    from diagnostic_msgs.msg import DiagnosticArray
    from ros_harness import reference_session

    _, planner = flashrt
    diags = []
    planner.node.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
    from flashrt_ros.ros.io.convert import message_to_obs
    ref = reference_session()
    obs = observation_trace(10)

    def same_as_reference(step_msg, o):
        assert np.asarray(step_msg.action, np.float32).tobytes() == ref.step(o).action.tobytes()

    rogue = joint_state(obs[0], 1_000_000_000)
    rogue.name = [f"other{i}" for i in range(7)]
    same_as_reference(planner.publish_and_wait(rogue), obs[0])  # message order: names are not checked...
    same_as_reference(planner.step(obs[1]), obs[1])  # ...and the first publisher fixes no joint order
    # the joint order changes mid-stream: stepped as flashrt-replay's offline conversion reads it
    rev = joint_state(obs[2], 2_000_000_000)
    rev.name, rev.position, rev.velocity = rev.name[::-1], rev.position[::-1], rev.velocity[::-1]
    same_as_reference(planner.publish_and_wait(rev), message_to_obs(rev, "joint_state", 14))
    bad = [joint_state(obs[2], 3_000_000_000 + i) for i in range(4)]
    bad[0].name = bad[0].name[:2]  # 2 names for 7 joints
    bad[1].name = [f"joint{i}" for i in range(14)]  # 14 positions, 0 velocities
    bad[1].position, bad[1].velocity = list(obs[2]), []
    bad[2].name = [f"joint{i}" for i in range(10)]  # 10 positions, 4 velocities
    bad[2].position, bad[2].velocity = list(obs[2][:10]), list(obs[2][10:])
    bad[3].name = ["joint0"] * 7  # duplicates
    n = len(planner.steps)
    for m in bad:
        planner.publish(m)
        planner.spin(0.05)
    planner.spin(0.3)
    assert len(planner.steps) == n, "a refused JointState was stepped"
    same_as_reference(planner.step(obs[3]), obs[3])  # the live state is untouched
    end, values = time.monotonic() + 10, []
    while time.monotonic() < end:
        planner.spin(0.1)
        values = [{kv.key: kv.value for kv in s.values} for d in diags for s in d.status]
        if values and int(values[-1]["steps"]) == 4:
            break
    assert values and int(values[-1]["rejected_inputs"]) == 4
    assert int(values[-1]["joint_name_mismatches"]) == 0
