"""replan_result_kept_s (issue 47.3): a finished Replan goal is kept that long for a late get_result, since every
action client deserialises the status of each kept goal at every change. A client that asks later gets a clear
UNKNOWN with the reason, never a hang; one that asks at once (FlashRTClient does) gets its result."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros


@pytest.fixture
def node_params():
    return {"replan_result_kept_s": 0.5}


def test_a_result_asked_for_after_the_kept_time_is_a_clear_unknown_and_one_asked_at_once_arrives(flashrt,
                                                                                                 monkeypatch):
    from action_msgs.msg import GoalStatus

    from flashrt_ros.ros.client.task import ReplanTask
    _, planner = flashrt
    planner.run(observation_trace(5))
    branches = np.stack([observation_trace(4, seed=b) for b in range(2)])
    out = planner.client.replan(branches)
    assert out.succeeded and out.accepted_ms > 0 and out.rtt_ms >= out.accepted_ms

    real = ReplanTask._on_goal_response

    def asks_late(self, future):  # a client stalled 2.5 s between the acceptance and get_result
        time.sleep(2.5)
        real(self, future)
    monkeypatch.setattr(ReplanTask, "_on_goal_response", asks_late)
    late = planner.client.replan(branches, timeout_s=10.0)
    assert late.status == GoalStatus.STATUS_UNKNOWN and not late.succeeded and late.accepted
    assert "replan_result_kept_s" in late.result.message
