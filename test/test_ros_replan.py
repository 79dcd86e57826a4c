"""The Replan action's admission over DDS: every goal gets an answer, a refusal carries its reason and
changes nothing, at most one replan runs, the deadline is capped. One node start-up for all of it."""
import json
import subprocess
import sys

import numpy as np
import pytest
from replan_helpers import live_sha
from ros_harness import NodeProcess

from conftest import observation_trace

pytestmark = pytest.mark.ros


def test_refused_goals_carry_their_reason_change_nothing_and_every_goal_of_a_burst_is_answered(
        flashrt, ros_domain, tmp_path):
    from action_msgs.msg import GoalStatus

    from flashrt_interfaces.action import Replan
    proc, planner = flashrt
    obs = observation_trace(40)
    planner.run(obs[:10])
    sha = live_sha(planner, "before")

    # --- a refusal says why (over the wire: ABORTED, rejected=true, the reason in message) ---
    long_8x5000 = np.zeros((8, 5000, 14), np.float32)
    refused = {
        "observations has 5 values": Replan.Goal(branches=2, horizon=3, observations=[0.0] * 5),
        "max_branches": Replan.Goal(branches=99, horizon=1, observations=[0.0] * 99 * 14),
        "commit_branch": Replan.Goal(branches=1, horizon=1, observations=[0.0] * 14, commit_branch=3),
        "non-finite": Replan.Goal(branches=1, horizon=1, observations=[float("nan")] * 14),
        "deadline_ms must be >= 0": Replan.Goal(branches=1, horizon=1, observations=[0.0] * 14, deadline_ms=-1.0),
        "unknown capsule": Replan.Goal(capsule_id=777777, branches=1, horizon=1, observations=[0.0] * 14),
        # the goal that held the robot for 14.8 s: over the cap (replan_max_deadline_ms, default 200)
        "over replan_max_deadline_ms 200": Replan.Goal(branches=8, horizon=5000, deadline_ms=1e9,
                                                       observations=long_8x5000.ravel().tolist()),
    }
    for why, goal in refused.items():
        out = planner.client.send_goal(goal)
        assert not out.accepted and why in out.reason, (why, out.reason)
        assert out.status == GoalStatus.STATUS_ABORTED and out.result.rejected and not out.result.success
        assert out.actions().size == 0
    # the same from the Python spelling of "none" (capsule_id / commit_branch / deadline_ms = None)
    out = planner.client.replan(np.stack([obs[10:14]] * 2), capsule_id=None, commit_branch=None, deadline_ms=None)
    assert out.accepted and out.succeeded and out.actions().shape == (2, 4, 7) and out.reason == ""
    assert live_sha(planner, "after") == sha, "a refused goal or a what-if changed the live state"
    assert planner.step(obs[10]).step == 11

    # --- a burst of 20 goals: each one answered, one runs at a time, the others are told why ---
    # the longest deadline the node allows: every goal that runs finishes, however slow the CPU
    tasks = [planner.client.send_replan(np.stack([obs[:8] + 0.1 * b for b in range(4)]), deadline_ms=200.0)
             for _ in range(20)]
    outcomes = [t.get_result(timeout_s=30.0) for t in tasks]
    ran = [o for o in outcomes if o.accepted]
    assert ran and all(o.succeeded and o.actions().shape == (4, 8, 7) for o in ran)
    assert all("busy" in o.reason for o in outcomes if not o.accepted), {o.reason for o in outcomes}
    assert all(t.is_task_complete() for t in tasks)

    # --- the demo planner survives refusals: a node with max_branches 2 refuses its 4-branch goals ---
    refusing = NodeProcess(ros_domain, tmp_path / "refusing.log", namespace="/refusing",
                           capsule_dir=str(tmp_path / "capsules"), max_branches=2)
    try:
        summary_path = tmp_path / "planner.json"
        run = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.demo.planner", "--duration", "3", "--period",
                              "0.3", "--namespace", "/refusing", "--json", str(summary_path)], env=ros_domain,
                             capture_output=True, text=True, timeout=60)
    finally:
        assert refusing.stop() == 0, refusing.output()[-2000:]
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert "replan refused: rejected: branches must be 1..2 (max_branches), got 4" in run.stdout, run.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["replans_refused"] == summary["rounds"] >= 2
    assert planner.client.replan(np.stack([obs[:8]])).succeeded
    assert "replan goal rejected" in proc.output()
