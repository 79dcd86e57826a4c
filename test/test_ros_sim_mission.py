"""flashrt-demo's arm mission through ROS: the sim's first seeded fault is corrected late, and the planner has the
policy node re-step the corrected readings from the capsule before the fault as one committed replan."""
import json
import subprocess
import sys

import pytest
from ros_harness import ROOT

from flashrt_ros.sim.faults import draw_faults
from flashrt_ros.sim.mission import HELD_OUT_SEED_BASE

pytestmark = pytest.mark.ros
SECONDS = 1.2


def test_arm_mission_commits_a_correction_replan_from_the_capsule_before_the_fault(ros_domain, tmp_path):
    first = draw_faults(HELD_OUT_SEED_BASE, 10**6)[0]
    assert first.arrival < SECONDS * 100  # the seed's first fault is corrected within the mission
    out = tmp_path / "arm.json"
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.demo", "--duration", str(SECONDS), "--episode-s",
                          str(SECONDS), "--json", str(out)], cwd=ROOT, env=ros_domain, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["ok"] and s["mission"] == "arm" and s["node_exit_code"] == 0 and not s["node_traceback"]
    assert s["episodes"] == len(s["per_episode"]) == 1 and s["readings"] > 100 and s["steps"] > 100
    assert s["corrections"] >= 1 and s["faults_by_kind"].get(first.kind, 0) >= 1
    assert s["replans_committed"] == s["correction_replans"] == s["corrections"]
    assert s["replan_ms"]["p50"] > 0 and s["replan_ms"]["p99"] >= s["replan_ms"]["p50"]
    assert "deadline_misses" in s and s["byte_exact_checks"]["run"] == s["byte_exact_checks"]["passed"] >= 1
    assert "task successes" in res.stdout and "replan round trip p50 / p99" in res.stdout

