"""What one step sends to a controller (ros2_control), besides policy_step.

- 'action' (std_msgs/Float64MultiArray): the step's action, one value per joint in action_joint_names
  order, layout filled (label 'joints', size, stride), as forward_command_controller takes it, and a second
  dimension naming the leader's epoch (flashrt_epoch=<e>, size 1, stride 1: io/fence.py).
- 'action_trajectory' (trajectory_msgs/JointTrajectory, with publish_trajectory): the step's whole action chunk
  for joint_trajectory_controller, as the chunk head gives it: not the temporal ensemble that 'action' carries
  (the blend of the last chunk_len chunks), but in the same units (action_scale, action_offset applied).
  Point k: positions chunk[k], time_from_start (k + 1) * control_period_s, velocities the central finite
  differences of the chunk's positions over control_period_s (one-sided at point 0, zero at the last point:
  the chunk ends at rest). header.stamp is zero, as MoveIt Servo sends it: the controller starts the
  trajectory when it arrives. The observation's stamp would be ~10 ms old by then (a step, DDS), so point 0
  would already be past on arrival, and a controller on another computer would add its clock offset;
  header.frame_id is the leader's fence, flashrt_epoch=<e> (io/fence.py). policy_step carries the observation's
  stamp and frame_id.

Both are lifecycle publishers: nothing goes out unless the node is active.
"""
from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, MultiArrayLayout
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .convert import check_controller_joint_names
from .fence import fence_label

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
    return check_controller_joint_names("action_joint_names", configured)  # a policy file's names too


def trajectory_points(chunk: np.ndarray, scale, offset, period_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(positions, velocities) [chunk_len, action_dim] float64 of a chunk: chunk * scale + offset, and the
    central differences of consecutive positions over period_s (one-sided at point 0, zero at the last)."""
    pos = chunk.astype(np.float64) * np.asarray(scale, np.float64) + np.asarray(offset, np.float64)
    vel = np.zeros_like(pos)
    if len(pos) > 1:
        vel[:-1] = np.gradient(pos, period_s, axis=0)[:-1]
    return pos, vel


def duration_of(seconds: float) -> Duration:
    ns = int(round(seconds * 1e9))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


class ActionOutputs:
    def __init__(self, node, action_dim: int, chunk_len: int, joint_names: list[str], trajectory: bool,
                 control_period_s: float, profiles: dict, topic=lambda name: name, units=(1.0, 0.0)):
        """``topic(name)``: the name to publish ``name`` on (a standby publishes on the primary's). ``units``:
        the policy's (action_scale, action_offset), which the trajectory's positions get as 'action' does."""
        self.node, self.joint_names = node, joint_names
        self._units, self._period_s = units, control_period_s
        self._joints = MultiArrayDimension(label=ACTION_LAYOUT_LABEL, size=action_dim, stride=action_dim)
        self.set_epoch(0)
        self._times = [duration_of((k + 1) * control_period_s) for k in range(chunk_len)]
        self.action_pub = node.create_lifecycle_publisher(Float64MultiArray, topic("action"), profiles["action"])
        self.trajectory_pub = (node.create_lifecycle_publisher(JointTrajectory, topic("action_trajectory"),
                                                               profiles["action_trajectory"])
                               if trajectory else None)

    def set_epoch(self, epoch: int) -> None:
        """The leader's epoch, carried from here on by every action and trajectory (io/fence.py); 0: none."""
        self.epoch = epoch
        fence = [MultiArrayDimension(label=fence_label(epoch), size=1, stride=1)] if epoch else []
        self._layout = MultiArrayLayout(dim=[self._joints, *fence], data_offset=0)

    def publish_action(self, action: np.ndarray) -> None:
        self.action_pub.publish(Float64MultiArray(layout=self._layout, data=action.astype(np.float64).tolist()))

    def publish_trajectory(self, header, chunk: np.ndarray) -> None:
        """``header``: the step's (the observation's stamp and frame_id)."""
        if self.trajectory_pub is None:
            return
        pos, vel = trajectory_points(chunk, *self._units, self._period_s)
        msg = JointTrajectory(joint_names=self.joint_names, points=[
            JointTrajectoryPoint(positions=p, velocities=v, time_from_start=t)
            for p, v, t in zip(pos.tolist(), vel.tolist(), self._times)])
        # stamp zero: started on arrival (see above); the frame names the leader's epoch (io/fence.py)
        msg.header.frame_id = fence_label(self.epoch) if self.epoch else header.frame_id
        self.trajectory_pub.publish(msg)

    def destroy(self) -> None:
        destroy = getattr(self.node, "destroy_lifecycle_publisher", self.node.destroy_publisher)
        for pub in (self.action_pub, self.trajectory_pub):
            if pub is not None:
                destroy(pub)
