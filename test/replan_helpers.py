"""Helpers shared by the Replan action tests: live-state checksum, parameters, lifecycle, long goals."""
from __future__ import annotations

import time

import numpy as np

from conftest import observation_trace


def live_sha(planner, name: str) -> str:
    """sha256 of the live state's bytes: snapshot it, export it (the checksum covers the state)."""
    snap = planner.client.snapshot(label=name)
    assert snap.success, snap.message
    exp = planner.client.export_capsule(f"{name}.safetensors", capsule_id=snap.capsule.id)
    assert exp.success, exp.message
    return exp.sha256


def set_param(planner, name: str, value: float) -> None:
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters
    cli = planner.node.create_client(SetParameters, f"{planner.namespace}/flashrt/set_parameters")
    assert cli.wait_for_service(timeout_sec=10)
    req = SetParameters.Request(parameters=[Parameter(name=name, value=ParameterValue(
        type=ParameterType.PARAMETER_DOUBLE, double_value=float(value)))])
    res = planner.client.wait_for(cli.call_async(req), 10).results[0]
    assert res.successful, res.reason
    planner.node.destroy_client(cli)


def change_state(planner, transition_id: int, timeout: float = 20.0) -> bool:
    from lifecycle_msgs.srv import ChangeState
    cli = planner.node.create_client(ChangeState, f"{planner.namespace}/flashrt/change_state")
    assert cli.wait_for_service(timeout_sec=20)
    req = ChangeState.Request()
    req.transition.id = transition_id
    ok = planner.client.wait_for(cli.call_async(req), timeout).success
    planner.node.destroy_client(cli)
    return ok


def long_goal_observations(horizon: int = 40_000) -> np.ndarray:
    """One branch long enough to run for seconds on any machine (~0.5 ms a batched step here)."""
    return np.tile(observation_trace(100), (horizon // 100, 1))[None]


def wait_for_feedback(planner, task, timeout: float = 20.0) -> None:
    """Spin until the goal has sent feedback: it is accepted and running."""
    end = time.monotonic() + timeout
    while not task.feedback:
        assert not task.is_task_complete(), task.get_result().result.message
        planner.spin(0.01)
        assert time.monotonic() < end, "no feedback from the replan"
