"""What one step sends to a controller (ros2_control), besides policy_step.

- 'action' (std_msgs/Float64MultiArray): the step's action, one value per joint in action_joint_names
  order, layout filled (one dimension: label, size, stride), as forward_command_controller takes it.
- 'action_trajectory' (trajectory_msgs/JointTrajectory, with publish_trajectory): the whole action chunk
  for joint_trajectory_controller. header.stamp is the observation's stamp; point k holds chunk[k] as
  positions, time_from_start (k + 1) * control_period_s: the controller reaches chunk[k] at the end of the
  k-th control period after the observation.

Both are lifecycle publishers: nothing goes out unless the node is active.
"""
from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, MultiArrayLayout
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

ACTION_LAYOUT_LABEL = "joints"


def default_joint_names(action_dim: int) -> list[str]:
    return [f"action_{i}" for i in range(action_dim)]


def action_joint_names(configured: list[str], action_dim: int) -> list[str]:
    """The names of the action's values; ValueError naming the parameter when they do not fit."""
    if not configured:
        return default_joint_names(action_dim)
    if len(configured) != action_dim:
        raise ValueError(f"action_joint_names: {len(configured)} names for action_dim {action_dim}; give one "
                         "name per action value, in the policy's output order")
    return list(configured)


def duration_of(seconds: float) -> Duration:
    ns = int(round(seconds * 1e9))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


class ActionOutputs:
    def __init__(self, node, action_dim: int, chunk_len: int, joint_names: list[str], trajectory: bool,
                 control_period_s: float, profiles: dict, topic=lambda name: name):
        """``topic(name)``: the name to publish ``name`` on (a standby publishes on the primary's)."""
        self.node, self.joint_names = node, joint_names
        layout = MultiArrayLayout(dim=[MultiArrayDimension(label=ACTION_LAYOUT_LABEL, size=action_dim,
                                                           stride=action_dim)], data_offset=0)
        self._layout = layout
        self._times = [duration_of((k + 1) * control_period_s) for k in range(chunk_len)]
        self.action_pub = node.create_lifecycle_publisher(Float64MultiArray, topic("action"), profiles["action"])
        self.trajectory_pub = (node.create_lifecycle_publisher(JointTrajectory, topic("action_trajectory"),
                                                               profiles["action_trajectory"])
                               if trajectory else None)

    def publish_action(self, action: np.ndarray) -> None:
        self.action_pub.publish(Float64MultiArray(layout=self._layout, data=action.astype(np.float64).tolist()))

    def publish_trajectory(self, header, chunk: np.ndarray) -> None:
        """``header``: the step's (the observation's stamp and frame_id)."""
        if self.trajectory_pub is None:
            return
        rows = chunk.astype(np.float64).tolist()
        msg = JointTrajectory(joint_names=self.joint_names, points=[
            JointTrajectoryPoint(positions=row, time_from_start=t) for row, t in zip(rows, self._times)])
        msg.header = header
        self.trajectory_pub.publish(msg)

    def destroy(self) -> None:
        destroy = getattr(self.node, "destroy_lifecycle_publisher", self.node.destroy_publisher)
        for pub in (self.action_pub, self.trajectory_pub):
            if pub is not None:
                destroy(pub)
