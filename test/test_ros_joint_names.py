"""joint_names on a real node: the joint order comes from the parameter, never from whoever publishes
first. A foreign JointState is refused with an ERROR on /diagnostics, real ones step (no reset, no
lifecycle transition needed), and reversed real names are mapped back by name."""

import numpy as np
import pytest
from ros_harness import Diagnostics, joint_state, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros

JOINTS = [f"joint{i}" for i in range(7)]


@pytest.fixture
def node_params():
    return {"joint_names": JOINTS}


def test_a_rogue_joint_state_is_refused_with_a_diagnostics_error_and_real_ones_step_by_name(flashrt):
    from diagnostic_msgs.msg import DiagnosticStatus
    _, planner = flashrt
    diags = Diagnostics(planner)
    ref = reference_session()
    obs = observation_trace(6)

    def same_as_reference(step_msg, o):
        assert np.asarray(step_msg.action, np.float32).tobytes() == ref.step(o).action.tobytes()

    rogue = joint_state(obs[0], 1_000_000_000)
    rogue.name = [f"other{i}" for i in range(7)]  # a foreign publisher speaks first
    planner.publish(rogue)
    status, values = diags.until(lambda v: v["joint_name_mismatches"] == "1")
    assert status.level == DiagnosticStatus.ERROR and "joint_names" in status.message
    assert "other0" in values["last_joint_name_error"] and values["steps"] == "0"  # refused: nothing stepped
    assert values["rejected_inputs"] == "1"

    same_as_reference(planner.step(obs[1]), obs[1])  # the real sensor steps at once
    rev = joint_state(obs[2], 2_000_000_000)
    rev.name, rev.position, rev.velocity = rev.name[::-1], rev.position[::-1], rev.velocity[::-1]
    same_as_reference(planner.publish_and_wait(rev), obs[2])  # mapped by name, not by position
    extra = joint_state(obs[3], 3_000_000_000)
    extra.name, extra.position, extra.velocity = ["gripper", *extra.name], [0.5, *extra.position], \
        [0.0, *extra.velocity]
    same_as_reference(planner.publish_and_wait(extra), obs[3])  # a joint not configured is ignored
    status, values = diags.until(lambda v: v["steps"] == "3")
    assert status.level != DiagnosticStatus.ERROR and values["joint_name_mismatches"] == "1"  # over: no error
