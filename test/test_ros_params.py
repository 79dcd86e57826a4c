"""Parameters as `ros2 param` users meet them, on a real node process: the deadline pair checked
together whichever is set, a double stays a double when set with an integer, every numeric parameter
describes the range the node enforces, and the replan deadline cap and the goal size are bounded."""
import pytest
from ros_harness import call

from conftest import observation_trace

pytestmark = pytest.mark.ros
NODE = "/test/flashrt"


@pytest.fixture
def node_params():
    # integers for doubles, at start-up: they stay doubles. A 1 MB goal bound, to test it cheaply.
    return {"capsule_budget_mb": 512, "replan_deadline_ms": 40, "replan_max_goal_mb": 1}


def param_value(value):
    from rcl_interfaces.msg import ParameterType, ParameterValue
    if isinstance(value, str):
        return ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)
    if isinstance(value, int):
        return ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
    return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)


def set_params(planner, atomically=False, **values):
    """SetParameters (one result per parameter) or SetParametersAtomically (one result)."""
    from rcl_interfaces.msg import Parameter
    from rcl_interfaces.srv import SetParameters, SetParametersAtomically
    params = [Parameter(name=n, value=param_value(v)) for n, v in values.items()]
    if atomically:
        return call(planner, SetParametersAtomically, f"{NODE}/set_parameters_atomically", parameters=params).result
    (result,) = call(planner, SetParameters, f"{NODE}/set_parameters", parameters=params).results
    return result


def get(planner, *names):
    """{name: (type, value)} as the node holds them."""
    from rcl_interfaces.msg import ParameterType
    from rcl_interfaces.srv import GetParameters
    values = call(planner, GetParameters, f"{NODE}/get_parameters", names=list(names)).values
    field = {ParameterType.PARAMETER_DOUBLE: "double_value", ParameterType.PARAMETER_INTEGER: "integer_value"}
    return {n: (v.type, getattr(v, field.get(v.type, "string_value"))) for n, v in zip(names, values)}


def describe(planner, names):
    from rcl_interfaces.srv import DescribeParameters
    answer = call(planner, DescribeParameters, f"{NODE}/describe_parameters", names=names)
    return {d.name: d for d in answer.descriptors}


def deadlines(planner):
    got = get(planner, "replan_deadline_ms", "replan_max_deadline_ms")
    return got["replan_deadline_ms"][1], got["replan_max_deadline_ms"][1]


def test_the_deadline_and_its_cap_are_checked_together_whichever_is_set(flashrt):
    _, planner = flashrt
    assert deadlines(planner) == (40.0, 200.0)
    # the default deadline above the cap: refused, whichever of the two is set
    r = set_params(planner, replan_deadline_ms=500.0)
    assert not r.successful and "replan_max_deadline_ms" in r.reason, r.reason
    assert set_params(planner, replan_max_deadline_ms=100.0).successful
    r = set_params(planner, replan_deadline_ms=150.0)
    assert not r.successful and "must not exceed replan_max_deadline_ms (100)" in r.reason, r.reason
    assert set_params(planner, replan_deadline_ms=80.0).successful
    r = set_params(planner, replan_max_deadline_ms=60.0)
    assert not r.successful and "replan_deadline_ms (80)" in r.reason, r.reason
    assert deadlines(planner) == (80.0, 100.0)
    # both at once: judged together
    assert not set_params(planner, atomically=True, replan_deadline_ms=150.0, replan_max_deadline_ms=120.0).successful
    assert set_params(planner, atomically=True, replan_deadline_ms=150.0, replan_max_deadline_ms=180.0).successful
    assert deadlines(planner) == (150.0, 180.0)
    # a goal that relies on the default runs
    out = planner.client.replan(observation_trace(4)[None])
    assert out.accepted and out.succeeded, out.reason


def test_the_replan_deadline_cap_never_rises_above_its_start_up_value(flashrt):
    _, planner = flashrt
    (rng,) = describe(planner, ["replan_max_deadline_ms"])["replan_max_deadline_ms"].floating_point_range
    assert rng.to_value == 200.0  # the start-up value is the ceiling, and the descriptor says so
    for too_long in (1e9, 200.5):
        r = set_params(planner, replan_max_deadline_ms=too_long)
        assert not r.successful and "replan_max_deadline_ms" in r.reason, r.reason
    assert set_params(planner, replan_max_deadline_ms=50.0).successful  # lowering it is fine ...
    assert set_params(planner, replan_max_deadline_ms=200.0).successful  # ... and back up to the start-up value
    out = planner.client.replan(observation_trace(4)[None], deadline_ms=1e9)
    assert not out.accepted and "over replan_max_deadline_ms 200" in out.reason, out.reason


def test_an_integer_for_a_double_parameter_keeps_it_a_double(flashrt):
    from rcl_interfaces.msg import ParameterType
    _, planner = flashrt
    double = ParameterType.PARAMETER_DOUBLE
    # given as integers at start-up (params file / -p)
    assert get(planner, "capsule_budget_mb", "replan_deadline_ms", "replan_max_goal_mb") == {
        "capsule_budget_mb": (double, 512.0), "replan_deadline_ms": (double, 40.0), "replan_max_goal_mb": (double, 1.0)}
    # `ros2 param set /test/flashrt replan_deadline_ms 30` sends an integer
    for name, value in (("replan_deadline_ms", 30), ("step_deadline_ms", 12), ("replan_max_deadline_ms", 150)):
        r = set_params(planner, **{name: value})
        assert r.successful, r.reason
        assert get(planner, name) == {name: (double, float(value))}
        assert describe(planner, [name])[name].type == double
    r = set_params(planner, replan_deadline_ms="30")  # not a number at all: refused, type kept
    assert not r.successful
    assert get(planner, "replan_deadline_ms") == {"replan_deadline_ms": (double, 30.0)}


def test_every_numeric_parameter_describes_the_range_the_node_enforces(flashrt):
    from rcl_interfaces.msg import ParameterType
    from rcl_interfaces.srv import ListParameters

    from flashrt_ros.ros.params import LIVE_PARAMS, NODE_RANGES
    _, planner = flashrt
    names = [n for n in call(planner, ListParameters, f"{NODE}/list_parameters").result.names
             if n not in ("use_sim_time", "start_type_description_service")]
    types = {n: t for n, (t, _) in get(planner, *names).items()}
    described = describe(planner, names)
    numeric = {n for n, t in types.items() if t in (ParameterType.PARAMETER_DOUBLE, ParameterType.PARAMETER_INTEGER)}
    assert {"kv_window", "capsule_budget_mb", "replan_deadline_ms", "persist_fsync_records"} <= numeric
    for name in numeric:
        d = described[name]
        if types[name] == ParameterType.PARAMETER_DOUBLE:
            assert len(d.floating_point_range) == 1 and not d.integer_range, name
        else:
            assert len(d.integer_range) == 1 and not d.floating_point_range, name
    (kv,) = described["kv_window"].integer_range
    assert (kv.from_value, kv.step) == (1, 1)
    (noise,) = described["action_noise_std"].floating_point_range
    assert noise.from_value == 0.0
    for name, (lo, hi) in NODE_RANGES.items():
        (rng,) = described[name].floating_point_range or described[name].integer_range
        assert rng.from_value == lo and rng.to_value == (200.0 if name == "replan_max_deadline_ms" else hi), name
    # the live ones: the edges are taken, a value past either is refused with the parameter named
    for name in LIVE_PARAMS - {"replan_deadline_ms", "replan_max_deadline_ms"}:
        (rng,) = described[name].floating_point_range
        assert set_params(planner, **{name: rng.from_value}).successful
        assert set_params(planner, **{name: rng.to_value}).successful
        for bad in (rng.from_value / 2, rng.to_value * 2, -1.0, float("nan"), float("inf")):
            r = set_params(planner, **{name: bad})
            assert not r.successful and name in r.reason, (name, bad, r.reason)


def test_a_replan_goal_over_replan_max_goal_mb_is_refused_before_it_is_converted(flashrt):
    import numpy as np
    _, planner = flashrt
    obs = observation_trace(30)
    planner.run(obs[:5])
    per_step = 14 * 4  # obs_dim float32
    fits = int(2**20 // per_step)  # one branch of this horizon is just under 1 MB
    out = planner.client.replan(np.zeros((1, fits, 14), np.float32), deadline_ms=1.0)
    assert out.accepted and out.succeeded, out.reason
    out = planner.client.replan(np.zeros((1, fits + 1, 14), np.float32), deadline_ms=1.0)
    assert not out.accepted and "over replan_max_goal_mb 1" in out.reason, out.reason
    assert out.result.rejected and out.result.steps_done == 0
    # sizes that claim far more than was sent are refused on the sizes alone
    from flashrt_interfaces.action import Replan
    out = planner.client.send_goal(Replan.Goal(branches=8, horizon=2**32 - 1, observations=[0.0] * 14))
    assert not out.accepted and "goal too large" in out.reason and "replan_max_goal_mb" in out.reason, out.reason
    assert planner.step(obs[5]).step == 6


def test_a_params_file_with_every_node_parameter_loads_in_the_ros_free_tools(tmp_path):
    # flashrt-demo --runtime --config and flashrt-bench runtime --config read the node's params file without
    # ROS: each parameter the node declares must be skipped there, not refused as unknown
    import yaml

    from flashrt_ros.ros.params import NODE_PARAMS
    from flashrt_ros.runtime import PolicyConfig
    from flashrt_ros.runtime.model.config import NODE_PARAMETERS
    assert NODE_PARAMETERS == set(NODE_PARAMS) | {"use_sim_time"}  # rclpy declares use_sim_time
    node_only = {name: default for name, (default, *_rest) in NODE_PARAMS.items()}
    path = tmp_path / "robot.yaml"
    params = {**node_only, "use_sim_time": False, "kv_window": 512}
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    assert PolicyConfig.from_yaml(path) == PolicyConfig(kv_window=512)


def test_the_documented_parameter_table_is_the_one_made_from_the_declarations():
    import importlib.util

    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("param_table", ROOT / "scripts" / "param_table.py")
    param_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(param_table)
    page = param_table.table_page()
    assert page == ROOT / "docs" / "ros.md"  # where the ROS interface is documented (issue 45)
    text = page.read_text()
    assert param_table.readme_with_table(text) == text, \
        "docs/ros.md's parameter table is out of date: run `python scripts/param_table.py --write`"
    named = {row[0] for row in param_table.rows()}
    from flashrt_ros.runtime.model.config import NODE_PARAMETERS
    assert NODE_PARAMETERS - {"use_sim_time"} <= named  # every parameter a params file may hold has a row
