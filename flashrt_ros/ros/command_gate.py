"""flashrt_command_gate: the fence in front of a ros2_control controller (issue 44, point 2). It forwards
``action_in`` -> ``action_out`` (std_msgs/Float64MultiArray) and ``action_trajectory_in`` ->
``action_trajectory_out`` (trajectory_msgs/JointTrajectory), dropping every command whose epoch (io/fence.py) is
older than the newest it has forwarded, or that carries none. So once a standby's first command passed, a zombie
leader's commands never reach the hardware, even if the lease (docs/leadership.md) failed. Each topic has its
own fence (a setup uses one of the two). Remap the four names to the robot's, e.g.:

    ros2 run flashrt_ros flashrt_command_gate --ros-args -r __ns:=/robot1 \\
      -r action_in:=/robot1/action -r action_out:=/forward_position_controller/commands
"""
from __future__ import annotations

import sys

from .io.fence import EpochFence, action_epoch, trajectory_epoch
from .io.qos import action_default


class CommandGate:
    def __init__(self, node):
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        self.node = node
        self.fences = {"action": EpochFence(), "action_trajectory": EpochFence()}
        for name, kind, epoch_of in (("action", Float64MultiArray, action_epoch),
                                     ("action_trajectory", JointTrajectory, trajectory_epoch)):
            pub = node.create_publisher(kind, f"{name}_out", action_default())
            node.create_subscription(kind, f"{name}_in", self._forward(name, pub, epoch_of), action_default())

    def _forward(self, name: str, pub, epoch_of):
        fence = self.fences[name]

        def on_command(msg) -> None:
            epoch = epoch_of(msg)
            if fence.admit(epoch):
                pub.publish(msg)
            else:
                self.node.get_logger().warning(
                    f"{name}: a command of epoch {epoch} dropped (newest {fence.newest}; {fence.dropped} dropped)",
                    throttle_duration_sec=1.0)
        return on_command


def main(args=None) -> int:
    import rclpy
    from rclpy.executors import ExternalShutdownException

    rclpy.init(args=args if args is not None else sys.argv)
    node = rclpy.create_node("flashrt_command_gate")
    CommandGate(node)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
