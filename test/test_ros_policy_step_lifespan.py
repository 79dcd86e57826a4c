"""No stale policy_step for a late subscriber (issue 44, point 6): the node's transient-local history keeps a step
POLICY_STEP_LIFESPAN_S only. A subscriber that matches seconds after the last step gets none of them (it got the
last 10, actions and chunks, 5 s later); one that matches at once still gets the history (the handshake race
step_link.py describes)."""
from __future__ import annotations

import time

import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros


def test_a_late_subscriber_gets_no_steps_older_than_the_lifespan_and_a_prompt_one_gets_the_history(flashrt):
    from flashrt_interfaces.msg import PolicyStep
    from flashrt_ros.ros.io.step_link import POLICY_STEP_DEPTH, POLICY_STEP_LIFESPAN_S, policy_step_qos
    _, planner = flashrt
    node = planner.node
    for o in observation_trace(20):
        planner.step(o)
    last = planner.steps[-1].step
    prompt = []
    node.create_subscription(PolicyStep, "/test/policy_step", prompt.append, policy_step_qos(100))
    assert planner.spin_until(lambda: len(prompt) >= POLICY_STEP_DEPTH, 10.0), len(prompt)
    assert [m.step for m in prompt] == list(range(last - POLICY_STEP_DEPTH + 1, last + 1))
    time.sleep(POLICY_STEP_LIFESPAN_S + 2.0)  # nothing stepped meanwhile
    late = []
    node.create_subscription(PolicyStep, "/test/policy_step", late.append, policy_step_qos(100))
    planner.spin(3.0)  # matched within this (the prompt subscriber's history came in well under it)
    assert late == [], [m.step for m in late]
    planner.step(observation_trace(21)[-1])  # and it is matched: a new step reaches it
    assert planner.spin_until(lambda: len(late) == 1, 10.0) and late[0].step == last + 1
