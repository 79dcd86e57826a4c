"""The command gate (issue 44, point 2): every action and trajectory carries its leader's epoch (io/fence.py), and
flashrt_command_gate, in front of a controller, forwards only commands of the newest epoch it has seen. A
node's own commands pass; once a newer leader's command passed, the old leader's (a zombie that the lease did
not stop) never reach the controller, and neither does a command without a fence."""
from __future__ import annotations

import time

import numpy as np
import pytest
from ros_harness import joint_state

from conftest import observation_trace

pytestmark = pytest.mark.ros

OBS = observation_trace(20)


def test_fence_labels_round_trip_and_the_fence_admits_only_the_newest_epoch():
    from flashrt_ros.ros.io.fence import EpochFence, fence_label, parse_fence
    assert [parse_fence(fence_label(e)) for e in (1, 2, 2**21)] == [1, 2, 2**21]
    assert [parse_fence(x) for x in ("", "joints", "flashrt_epoch=", "flashrt_epoch=-1", "flashrt_epoch=1e3",
                                     "flashrt_epoch=" + "9" * 21)] == [0] * 6
    fence = EpochFence()
    assert [fence.admit(e) for e in (1, 1, 2, 1, 0, 2, 3, 2)] == [True, True, True, False, False, True, True, False]
    assert fence.dropped == 3


def test_the_gate_forwards_the_leaders_commands_and_drops_an_older_leaders(flashrt):
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension
    from trajectory_msgs.msg import JointTrajectory

    from flashrt_ros.ros.command_gate import CommandGate
    from flashrt_ros.ros.io.fence import action_epoch, fence_label, trajectory_epoch
    from flashrt_ros.ros.io.qos import action_default
    proc, planner = flashrt
    node = planner.node
    gate_node = planner.rclpy.create_node("gate", namespace="/gate")
    try:
        CommandGate(gate_node)
        ins = {name: node.create_publisher(kind, f"/gate/{name}_in", action_default())
               for name, kind in (("action", Float64MultiArray), ("action_trajectory", JointTrajectory))}
        outs: dict[str, list] = {"action": [], "action_trajectory": []}
        for name, kind in (("action", Float64MultiArray), ("action_trajectory", JointTrajectory)):
            node.create_subscription(kind, f"/gate/{name}_out", outs[name].append, action_default())
        # the node's own commands, relayed into the gate as a controller's setup would remap them
        node.create_subscription(Float64MultiArray, "/test/action", ins["action"].publish, action_default())

        def spin(seconds):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                planner.rclpy.spin_once(node, timeout_sec=0.005)
                planner.rclpy.spin_once(gate_node, timeout_sec=0.005)

        end = time.monotonic() + 15.0
        while min(p.get_subscription_count() for p in ins.values()) < 1 or \
                node.count_publishers("/test/action") < 1 or node.count_publishers("/gate/action_out") < 1:
            assert time.monotonic() < end, "the gate never matched"
            spin(0.05)
        spin(0.3)
        for o in OBS[:5]:
            planner.stamp += 10_000_000
            planner.publish(joint_state(o, planner.stamp))
            spin(0.05)
        assert planner.spin_until(lambda: len(planner.steps) >= 5) and spin(0.5) is None
        assert [action_epoch(m) for m in outs["action"]] == [1] * 5, "the node's own commands pass (epoch 1)"
        assert [np.asarray(m.data).tobytes() for m in outs["action"]] == \
            [np.asarray(s.action, np.float32).astype(np.float64).tobytes() for s in planner.steps[-5:]]

        def action(epoch, value):
            msg = Float64MultiArray(data=[value] * 7)
            msg.layout.dim = [MultiArrayDimension(label="joints", size=7, stride=7),
                              *([MultiArrayDimension(label=fence_label(epoch), size=1, stride=1)] if epoch else [])]
            return msg
        ins["action"].publish(action(2, 2.0))  # a new leader (a standby that took over)
        spin(0.3)
        for o in OBS[5:10]:  # the old one goes on: a zombie
            planner.stamp += 10_000_000
            planner.publish(joint_state(o, planner.stamp))
            spin(0.05)
        ins["action"].publish(action(0, 9.0))  # no fence at all
        ins["action"].publish(action(2, 2.5))
        for epoch in (1, 2, 1, 3, 2):
            traj = JointTrajectory()
            traj.header.frame_id = fence_label(epoch)
            ins["action_trajectory"].publish(traj)
        assert planner.spin_until(lambda: len(planner.steps) >= 10)
        spin(0.5)
    finally:
        gate_node.destroy_node()
    assert [action_epoch(m) for m in outs["action"]] == [1] * 5 + [2, 2], "only the newest leader's commands pass"
    assert [m.data[0] for m in outs["action"][5:]] == [2.0, 2.5]
    assert [trajectory_epoch(m) for m in outs["action_trajectory"]] == [1, 2, 3]
    assert all(s.epoch == 1 for s in planner.steps), "policy_step carries the leader's epoch"
