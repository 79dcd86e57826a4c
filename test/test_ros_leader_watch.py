"""A replica follows the best leader claim (newest epoch, then the earlier claim), but only among nodes still
in the graph: a deposed or dead leader's claim of a newer epoch must not outrank a restarted primary that claims
epoch 1 again (the standby that took over died, then the robot was restarted)."""
from __future__ import annotations

import time

import pytest
from ros_harness import NodeProcess, Planner

pytestmark = pytest.mark.ros

FOLLOWS_A = "/robot1_a/flashrt leads the robot since epoch 2"
FOLLOWS_B = "/robot1_b/flashrt leads the robot since epoch 1"


def test_a_replica_follows_a_lower_epoch_once_the_node_of_the_higher_claim_left_the_graph(ros_domain, tmp_path):
    import rclpy

    from flashrt_interfaces.msg import Leader
    from flashrt_ros.ros.group.leader import leader_qos
    replica = NodeProcess(ros_domain, tmp_path / "replica.log", namespace="/ws", role="replica",
                          primary="/robot1/flashrt", capsule_dir=str(tmp_path / "replica_caps"))
    planner = Planner(namespace="/ws")
    claimers = []

    def claim(namespace: str, epoch: int):
        """A node of the claimed name, with its writer on the leader topic: a claim of its own."""
        node = rclpy.create_node("flashrt", namespace=namespace)
        claimers.append(node)
        pub = node.create_publisher(Leader, "/robot1/flashrt_leader", leader_qos())
        return node, lambda: pub.publish(Leader(stamp=node.get_clock().now().to_msg(), epoch=epoch,
                                                node=f"{namespace}/flashrt", step=0, capsule_id=0))

    try:
        planner.client.wait_until_ready(30.0)
        node_a, claim_a = claim("/robot1_a", 2)
        claim_a()  # transient local: the replica gets it once matched
        assert planner.spin_until(lambda: FOLLOWS_A in replica.output(), 20.0), replica.output()[-3000:]
        claimers.remove(node_a)
        node_a.destroy_node()  # its writer leaves the graph: A's claim is of a node gone
        _, claim_b = claim("/robot1_b", 1)
        end = time.monotonic() + 20.0
        while FOLLOWS_B not in replica.output() and time.monotonic() < end:
            claim_b()  # again until the replica's graph has seen A go (a claim taken before that is outranked)
            planner.spin(0.5)
    finally:
        for node in claimers:
            node.destroy_node()
        planner.close()
        replica.stop()
    log = replica.output()
    assert FOLLOWS_B in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
