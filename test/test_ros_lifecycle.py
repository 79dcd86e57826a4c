"""Lifecycle transitions over ROS, what exists in each state, and the parameters' contract."""
import signal
import time

import pytest
from ros_harness import Diagnostics, NodeProcess, Planner, call, joint_state

from conftest import observation_trace

pytestmark = pytest.mark.ros

# what launch/flashrt.launch.py passes besides the params file (autostart:=false, log_level, use_sim_time)
LAUNCH_ARGS = ("--log-level", "info")


def change_state(planner, transition_id: int) -> bool:
    from lifecycle_msgs.srv import ChangeState
    req = ChangeState.Request()
    req.transition.id = transition_id
    return call(planner, ChangeState, "/test/flashrt/change_state", 20, transition=req.transition).success


def get_state(planner) -> str:
    from lifecycle_msgs.srv import GetState
    return call(planner, GetState, "/test/flashrt/get_state", 20).current_state.label


def serving(planner, expect: bool, timeout: float = 10.0) -> bool:
    """Wait for the graph to show the snapshot service (dis)appearing."""
    end = time.monotonic() + timeout
    while bool(planner.node.count_services("/test/snapshot")) != expect and time.monotonic() < end:
        planner.spin(0.05)
    return bool(planner.node.count_services("/test/snapshot"))


def describe(planner, names):
    from rcl_interfaces.srv import DescribeParameters
    return call(planner, DescribeParameters, "/test/flashrt/describe_parameters", names=names).descriptors


def set_param(planner, name, value):
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters
    v = (ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value) if isinstance(value, int)
         else ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value))
    return call(planner, SetParameters, "/test/flashrt/set_parameters",
                parameters=[Parameter(name=name, value=v)]).results[0]


def test_lifecycle_transitions_over_ros_with_diagnostics_in_every_state(ros_domain, tmp_path):
    from lifecycle_msgs.msg import Transition

    from flashrt_ros.ros.io.diagnostics import cpu_model  # a ROS module: not importable where ROS is absent
    proc = NodeProcess(ros_domain, tmp_path / "node.log", autostart=False, backend="auto", use_sim_time=False,
                       extra_args=LAUNCH_ARGS)
    planner = Planner()
    diag = Diagnostics(planner)
    try:
        assert get_state(planner) == "unconfigured"
        status, values = diag.state("unconfigured")
        assert status.name == "test/flashrt: runtime"
        assert serving(planner, True)  # every state has the services (refusing: test_ros_lifecycle_gate)
        assert change_state(planner, Transition.TRANSITION_CONFIGURE) and get_state(planner) == "inactive"
        status, values = diag.state("inactive")
        assert status.hardware_id == cpu_model() != "numpy"
        assert serving(planner, True)
        assert change_state(planner, Transition.TRANSITION_ACTIVATE) and get_state(planner) == "active"
        planner.wait_ready()
        obs = observation_trace(20)
        planner.run(obs[:5])
        status, values = diag.until(lambda v: v["lifecycle_state"] == "active" and v["steps"] == "5")
        assert status.level == status.OK and int(values["rollback_depth_steps"]) == 4
        assert float(values["rollback_depth_s"]) > 0 and int(values["kv_log_entries_total"]) > 0
        assert change_state(planner, Transition.TRANSITION_DEACTIVATE) and get_state(planner) == "inactive"
        assert serving(planner, True)  # still there, refusing calls
        n = len(planner.steps)
        planner.publish(joint_state(obs[5], 1))
        planner.spin(0.5)
        assert len(planner.steps) == n, "an inactive node must not step"
        diag.state("inactive")
        assert change_state(planner, Transition.TRANSITION_ACTIVATE)
        planner.wait_ready()
        assert planner.step(obs[5]).step == 6  # the state survived deactivation
        assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
        assert change_state(planner, Transition.TRANSITION_CLEANUP) and get_state(planner) == "unconfigured"
        diag.state("unconfigured")
        proc.proc.send_signal(signal.SIGTERM)  # what a process supervisor sends: a clean exit too
        assert proc.proc.wait(15) == 0
    finally:
        planner.close()
        assert proc.stop() == 0
    out = proc.output()
    assert "Traceback" not in out
    # the runtime's Python logging reaches the ROS log: why backend auto took the compiled CPU backend
    assert "[flashrt_ros.runtime] backend: cpu (auto; CUDA unavailable" in out, out


def test_sizes_are_read_only_in_the_descriptor_and_deadlines_have_one_validation(flashrt):
    _, planner = flashrt
    kv, budget, deadline, cdir = describe(planner, ["kv_window", "capsule_budget_mb", "replan_deadline_ms",
                                                    "capsule_dir"])
    assert kv.read_only and budget.read_only and cdir.read_only and not deadline.read_only
    assert "read-only" in kv.description and "ROS_HOME" in cdir.description
    frozen = set_param(planner, "kv_window", 64)
    assert not frozen.successful and "read-only" in frozen.reason
    for bad in (float("inf"), float("nan"), -1.0):
        r = set_param(planner, "replan_deadline_ms", bad)
        assert not r.successful and "replan_deadline_ms" in r.reason
    assert set_param(planner, "replan_deadline_ms", 30).successful  # an integer for a float
    assert set_param(planner, "replan_deadline_ms", 30.0).successful


@pytest.fixture
def node_params():
    return {"capsule_budget_mb": 512}  # an integer for a float parameter is accepted


BAD_STARTS = {
    "kv_abc": ({"kv_window": "abc"}, None, "kv_window"),
    "kv_float": ({"kv_window": 1.5}, None, "kv_window"),
    "deadline_inf": ({"replan_deadline_ms": ".inf"}, None, "replan_deadline_ms"),
    "empty_capsule_dir": ({"capsule_dir": "''"}, None, "capsule_dir"),
    "backend_typo": ({"backend": "cdua"}, None, "backend"),
    "joint_names_dup": ({"joint_names": ["a", "a"]}, None, "joint_names"),
    "resume_without_persist_dir": ({"resume": True}, None, "persist_dir"),
    "persist_budget_below_two_segments": ({"persist_dir": "/nonexistent-flashrt/log", "persist_budget_mb": 10.0},
                                          None, "persist_budget_mb"),
    "deadline_over_its_cap": ({"replan_deadline_ms": 500.0}, None, "must not exceed replan_max_deadline_ms (200)"),
    "cap_over_the_ceiling": ({"replan_max_deadline_ms": 1e9}, None, "replan_max_deadline_ms: must be in"),
    # 8 records cannot hold the live step's capsule and a replan's 8 branch capsules: the budget is not to blame
    "capacity_below_the_reserve": ({"capsule_capacity": 8}, None, "capsule_capacity: 8 is below the 10"),
    "action_joint_names_count": ({"action_joint_names": ["a", "b"]}, None, "action_joint_names"),
    "qos_override_typo": ({"qos_overrides./test/observation.subscription.reliability": "reliabel"}, None,
                          "qos_overrides"),
    "qos_override_depth_0": ({"qos_overrides./test/policy_step.publisher.depth": 0}, None, "qos_overrides"),
    "missing_params_file": ({}, "/nonexistent/flashrt.yaml", "params file"),
    "invalid_params_file": ({}, "bad.yaml", "params file"),
}


# Nodes started at once, per batch: two dozen DDS participants starting together on 2 cores once ended one
# of them with SIGSEGV before it printed a line (empty log: in rclpy or the middleware, as far as we can tell)
START_BATCH = 6


def test_bad_parameters_and_params_files_give_one_line_naming_the_problem(ros_domain, tmp_path):
    (tmp_path / "bad.yaml").write_text("/**:\n  ros__parameters:\n    kv_window: [unclosed\n")
    procs = {}
    try:
        names = list(BAD_STARTS)
        for first in range(0, len(names), START_BATCH):
            batch = names[first:first + START_BATCH]
            for name in batch:
                params, params_file, _ = BAD_STARTS[name]
                pf = (tmp_path / params_file) if params_file == "bad.yaml" else params_file
                kw = {"params_file": pf} if params_file else {}
                procs[name] = NodeProcess(ros_domain, tmp_path / f"{name}.log", **kw, **params)
            for name in batch:
                procs[name].proc.wait(60)
    finally:
        for proc in procs.values():
            proc.stop()
    for name, proc in procs.items():
        out = proc.output()
        want = BAD_STARTS[name][2]
        assert proc.proc.returncode in (1, 2), (name, out)
        assert "Traceback" not in out, (name, out)
        errors = [ln for ln in out.splitlines() if want in ln and ("configure failed" in ln or "cannot start" in ln)]
        assert len(errors) == 1, (name, out)
        if name == "capacity_below_the_reserve":
            assert "cannot hold" not in out and "max_branches" in out, out


def test_an_inactive_node_publishes_nothing_on_its_lifecycle_publishers(ros_domain, tmp_path):
    """In-process (a real rclpy node and executor): step while configured but inactive, then active."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter
    from std_msgs.msg import Float64MultiArray

    from flashrt_interfaces.msg import PolicyStep
    from flashrt_ros.ros.node import FlashRTNode

    node = FlashRTNode(parameter_overrides=[
        Parameter("autostart", value=False), Parameter("backend", value="numpy"),
        Parameter("kv_window", value=64), Parameter("capsule_dir", value=str(tmp_path / "capsules"))])
    listener = rclpy.create_node("listener")
    got, actions = [], []
    listener.create_subscription(PolicyStep, "/policy_step", got.append, 10)
    listener.create_subscription(Float64MultiArray, "/action", actions.append, 10)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    executor.add_node(listener)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        # the action publisher is made on configure and matched while inactive (policy_step's writer is made
        # on activate: an inactive node has none)
        end = time.monotonic() + 10
        while listener.count_publishers("/action") == 0 and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        assert listener.count_publishers("/action") == 1 and listener.count_publishers("/policy_step") == 0
        obs = observation_trace(4)
        node.step_from_message(joint_state(obs[0], 1))  # the policy steps ...
        for _ in range(20):
            executor.spin_once(timeout_sec=0.05)
        assert node.stats.steps == 1 and got == [] and actions == []  # ... but an inactive node publishes nothing
        node.trigger_activate()
        node.step_from_message(joint_state(obs[1], 2))
        end = time.monotonic() + 10
        while not (got and actions) and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        assert [m.step for m in got] == [2] and len(actions) == 1
        node.trigger_deactivate()
        node.step_from_message(joint_state(obs[2], 3))
        for _ in range(20):
            executor.spin_once(timeout_sec=0.05)
        assert [m.step for m in got] == [2] and len(actions) == 1
    finally:
        node.release()
        executor.shutdown()
        listener.destroy_node()
        node.destroy_node()


def test_capsule_dir_defaults_to_ros_home_which_survives_a_reboot(monkeypatch, tmp_path):
    from flashrt_ros.ros.params import default_capsule_dir
    monkeypatch.setenv("ROS_HOME", str(tmp_path / "ros_home"))
    assert default_capsule_dir() == str(tmp_path / "ros_home" / "flashrt_capsules")
    monkeypatch.delenv("ROS_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_capsule_dir() == str(tmp_path / "home" / ".ros" / "flashrt_capsules")
