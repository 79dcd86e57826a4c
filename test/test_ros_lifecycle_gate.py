"""Services and the replan action while the node is not active, as nav2 servers behave: they stay, and
answer at once with a refusal naming the state; nothing changes. One log line per transition."""
import numpy as np
import pytest
from ros_harness import NodeProcess, Planner, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros

CALL_TIMEOUT_S = 5.0  # the services exist in every state: an answer, not a wait for discovery


def change_state(planner, transition_id: int) -> bool:
    from lifecycle_msgs.srv import ChangeState
    from ros_harness import call
    req = ChangeState.Request()
    req.transition.id = transition_id
    return call(planner, ChangeState, "/test/flashrt/change_state", 20, transition=req.transition).success


def every_call(client):
    """Each service once, with a request that would change the state if it ran (and the reads)."""
    return {
        "snapshot": lambda: client.snapshot(label="while_inactive", pin=True, timeout_s=CALL_TIMEOUT_S),
        "rollback": lambda: client.rollback(steps_back=2, timeout_s=CALL_TIMEOUT_S),
        "list_capsules": lambda: client.list_capsules(timeout_s=CALL_TIMEOUT_S),
        "drop_capsule": lambda: client.drop_capsule(1, timeout_s=CALL_TIMEOUT_S),
        "set_pin": lambda: client.set_pin(1, True, timeout_s=CALL_TIMEOUT_S),
        "export_capsule": lambda: client.export_capsule("inactive.safetensors", timeout_s=CALL_TIMEOUT_S),
        "import_capsule": lambda: client.import_capsule("kept.safetensors", restore=True, timeout_s=CALL_TIMEOUT_S),
        "reset": lambda: client.reset(timeout_s=CALL_TIMEOUT_S),
    }


def assert_everything_refused(planner, state: str, obs: np.ndarray) -> None:
    for name, fn in every_call(planner.client).items():
        r = fn()
        assert not r.success, (name, r.message)
        assert f"flashrt is {state}" in r.message and "activate it first" in r.message, (name, r.message)
    out = planner.client.replan(obs[None, :3], commit_branch=0, timeout_s=CALL_TIMEOUT_S)
    assert not out.succeeded and out.result.rejected, out.result.message
    assert f"flashrt is {state}" in out.result.message and "activate it first" in out.result.message


def store_view(planner):
    r = planner.client.list_capsules()
    assert r.success, r.message
    return r.live_capsule_id, [(c.id, c.step, c.pinned, c.label) for c in r.capsules]


def test_services_and_replan_refuse_while_not_active_and_change_nothing(ros_domain, tmp_path):
    from lifecycle_msgs.msg import Transition
    capsules = tmp_path / "capsules"
    proc = NodeProcess(ros_domain, tmp_path / "node.log", autostart=False, capsule_dir=str(capsules))
    planner = Planner()
    obs = observation_trace(12)
    try:
        planner.client.wait_until_ready(30.0)  # a process just started: discovery first (a refusal is an answer)
        assert_everything_refused(planner, "unconfigured", obs)
        assert change_state(planner, Transition.TRANSITION_CONFIGURE)
        assert_everything_refused(planner, "inactive", obs)
        assert change_state(planner, Transition.TRANSITION_ACTIVATE)
        planner.wait_ready()
        planner.run(obs[:5])
        pinned = planner.client.snapshot(label="kept", pin=True)
        assert pinned.success and planner.client.export_capsule("kept.safetensors").success
        before = store_view(planner)
        files_before = sorted(p.name for p in capsules.iterdir())

        assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
        assert_everything_refused(planner, "inactive", obs)
        assert sorted(p.name for p in capsules.iterdir()) == files_before  # no export was written

        assert change_state(planner, Transition.TRANSITION_ACTIVATE)
        planner.wait_ready()
        assert store_view(planner) == before
        # the live state is byte-identical: the next steps are those of an untouched reference run
        ref = reference_session()
        for o in obs[:5]:
            ref.step(o)
        for o in obs[5:8]:
            assert np.asarray(planner.step(o).action, np.float32).tobytes() == ref.step(o).action.tobytes()
        assert planner.client.snapshot(label="after").success  # served again once active
    finally:
        planner.close()
        assert proc.stop() == 0
    assert "Traceback" not in proc.output()
    assert "never counted as scheduled" not in proc.output()  # each refused goal's answer was counted


def test_every_transition_logs_one_line(ros_domain, tmp_path):
    from lifecycle_msgs.msg import Transition
    proc = NodeProcess(ros_domain, tmp_path / "node.log", autostart=False, capsule_dir=str(tmp_path / "c"))
    planner = Planner()
    try:
        for t in (Transition.TRANSITION_CONFIGURE, Transition.TRANSITION_ACTIVATE,
                  Transition.TRANSITION_DEACTIVATE, Transition.TRANSITION_CLEANUP,
                  Transition.TRANSITION_UNCONFIGURED_SHUTDOWN):
            assert change_state(planner, t), t
    finally:
        planner.close()
        assert proc.stop() == 0
    out = proc.output()
    for line_start in ("configure: done in", "activate: now active", "deactivate: now inactive",
                       "cleanup: runtime released, now unconfigured", "shutdown: from unconfigured"):
        assert sum(f"]: {line_start}" in ln for ln in out.splitlines()) == 1, (line_start, out)


def test_a_failed_activate_logs_why_and_the_error_transition(ros_domain, tmp_path, capfd):
    """In-process: an activate that raises (here: its QoS profiles lost) goes through on_error."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from flashrt_ros.ros.node import FlashRTNode
    node = FlashRTNode(parameter_overrides=[
        Parameter("autostart", value=False), Parameter("backend", value="numpy"),
        Parameter("kv_window", value=64), Parameter("capsule_dir", value=str(tmp_path / "capsules"))])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        node._qos = {}
        assert node.trigger_activate() == TransitionCallbackReturn.ERROR
        assert node.lifecycle_state() == "unconfigured" and node.session is None
        assert node.inactive_refusal().startswith("flashrt is unconfigured")
    finally:
        node.release()
        node.destroy_node()
    err = capfd.readouterr().err
    assert "activate failed:" in err and "error: a transition from inactive failed" in err, err
