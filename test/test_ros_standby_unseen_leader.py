"""A standby that follows a new leader it never saw alive (one that died before its liveliness reached this node,
so no liveliness event ever comes): the leader's silence counts as a lapse from its claim on, and after the idle
patience (IDLE_LEASES leases) the standby judges it lost instead of waiting for ever beside a robot nobody leads."""
from __future__ import annotations

import time

import pytest
from ros_harness import NodeProcess, Planner

pytestmark = [pytest.mark.ros, pytest.mark.serial]  # liveliness leases timed, as in test_ros_standby

LEASE_MS = 200.0
LOST = "/robot1_ghost/flashrt: not seen alive since it claimed the robot: liveliness lapsed for"


def _log_time(log: str, text: str) -> float:
    """The ROS log stamp (seconds) of the first line holding ``text``."""
    line = next(ln for ln in log.splitlines() if text in ln)
    return float(line.split("] [", 1)[1].split("]", 1)[0])


def test_a_standby_judges_a_followed_leader_it_never_saw_alive_lost_after_the_idle_patience(ros_domain, tmp_path):
    import rclpy

    from flashrt_interfaces.msg import Leader
    from flashrt_ros.ros.client import FlashRTClient
    from flashrt_ros.ros.group.leader import leader_qos
    from flashrt_ros.ros.group.standby import IDLE_LEASES
    standby = NodeProcess(ros_domain, tmp_path / "standby.log", namespace="/robot1_standby", role="standby",
                          primary="/robot1/flashrt", capsule_dir=str(tmp_path / "standby_caps"),
                          liveliness_lease_ms=LEASE_MS)
    planner = Planner(namespace="/robot1")
    # a node of the claimed name, with a writer on the leader topic (a claim counts only then: group/claims.py)
    # and no capsule stream: never seen alive
    ghost = rclpy.create_node("flashrt", namespace="/robot1_ghost")
    try:
        FlashRTClient(planner.node, "/robot1_standby").wait_until_ready(30.0)
        claims = ghost.create_publisher(Leader, "/robot1/flashrt_leader", leader_qos())
        # transient local: the standby gets it once matched, however late that is
        claims.publish(Leader(stamp=ghost.get_clock().now().to_msg(), epoch=2, node="/robot1_ghost/flashrt",
                              step=0, capsule_id=0))
        assert planner.spin_until(lambda: LOST in standby.output(), 20.0), standby.output()[-3000:]
        time.sleep(0.2)  # the takeover's refusal, logged right after
    finally:
        ghost.destroy_node()
        planner.close()
        standby.stop()
    log = standby.output()
    followed = _log_time(log, "/robot1_ghost/flashrt leads the robot since epoch 2")
    assert _log_time(log, LOST) - followed >= 0.9 * IDLE_LEASES * LEASE_MS / 1e3, log[-3000:]
    # nothing of the ghost's timeline held: stepping from zeros would be another robot's policy
    assert "stopped before this standby held any capsule of its timeline: not taking over" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
