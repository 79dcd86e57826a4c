"""A replica that has heard nothing from its primary says so on /diagnostics, as a warning naming the primary:
an OK there would hide a replica that holds nothing to serve."""
from __future__ import annotations

import pytest
from ros_harness import Diagnostics, NodeProcess, Planner

pytestmark = pytest.mark.ros


def test_a_replica_that_received_nothing_from_its_primary_warns_naming_it(ros_domain, tmp_path):
    from diagnostic_msgs.msg import DiagnosticStatus
    replica = NodeProcess(ros_domain, tmp_path / "replica.log", namespace="/ws", role="replica",
                          primary="/robot1/flashrt", capsule_dir=str(tmp_path / "replica_caps"))
    planner = Planner(namespace="/ws")
    try:
        planner.client.wait_until_ready(30.0)
        status, values = Diagnostics(planner).until(lambda v: v["lifecycle_state"] == "active", 15.0)
    finally:
        planner.close()
        replica.stop()
    assert (values["role"], values["primary"], values["replica_applied"]) == ("replica", "/robot1/flashrt", "0")
    assert status.level == DiagnosticStatus.WARN
    assert status.message == "replica: nothing received from /robot1/flashrt yet"
    assert "Traceback" not in replica.output(), replica.output()[-3000:]
