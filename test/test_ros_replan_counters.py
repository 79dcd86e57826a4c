"""/diagnostics counts the replans that ran and, of those, the ones that missed their deadline: a replan that
finished in time is no miss, one whose deadline passed after its first step is."""
from __future__ import annotations

import pytest
from ros_harness import Diagnostics

from conftest import observation_trace

pytestmark = pytest.mark.ros


@pytest.fixture
def node_params():
    return {"replan_max_deadline_ms": 10_000.0}  # a deadline no loaded machine misses for two steps


def test_a_replan_in_time_counts_no_deadline_miss_and_one_past_its_deadline_counts_one(flashrt):
    _, planner = flashrt
    obs = observation_trace(12)
    planner.run(obs[:10])
    diag = Diagnostics(planner)
    in_time = planner.client.replan(obs[None, 10:12], deadline_ms=10_000.0)
    assert in_time.succeeded and in_time.result.deadline_met, in_time.result.message
    _, values = diag.until(lambda v: v["replans"] == "1")
    assert values["replan_deadline_misses"] == "0"
    late = planner.client.replan(obs[None, 10:12], deadline_ms=0.001)  # passes during the first step
    assert late.succeeded and not late.result.deadline_met and late.result.steps_done == 1, late.result.message
    _, values = diag.until(lambda v: v["replans"] == "2")
    assert values["replan_deadline_misses"] == "1"
