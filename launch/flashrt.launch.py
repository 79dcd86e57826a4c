"""Start the flashrt lifecycle node with config/flashrt.yaml, in an optional namespace.

    ros2 launch flashrt_ros flashrt.launch.py namespace:=robot1 params_file:=/path/to/params.yaml

Arguments: namespace, params_file, autostart, log_level, use_sim_time, persist_dir, resume, role, primary.

A replica on a workstation (what-ifs off the robot) and a hot standby (takes over if the policy process
dies), each rebuilding the robot's capsules from its ~/capsule_stream (README: "Replicas and failover"):

    ros2 launch flashrt_ros flashrt.launch.py namespace:=ws role:=replica primary:=/robot1/flashrt
    ros2 launch flashrt_ros flashrt.launch.py namespace:=robot1_standby role:=standby primary:=/robot1/flashrt

Crash-resume on a robot: give the capsule log a directory on the robot's disk and turn resume on, so
a node restarted after an OOM kill, a watchdog or a power cut continues from its last persisted step:

    ros2 launch flashrt_ros flashrt.launch.py persist_dir:=/var/lib/flashrt resume:=true

Bringing the node up:
- autostart:=true (the default): the node configures and activates itself (its ``autostart``
  parameter), so it steps as soon as observations arrive.
- autostart:=false: the node waits in 'unconfigured' for a lifecycle manager
  (e.g. nav2_lifecycle_manager with node_names: [robot1/flashrt]) or for you:

      ros2 lifecycle set /robot1/flashrt configure
      ros2 lifecycle set /robot1/flashrt activate

  ``deactivate`` stops stepping and serving (the state and capsules are kept), ``cleanup`` frees the
  runtime.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue

from launch import LaunchDescription

PACKAGE = "flashrt_ros"
EXECUTABLE = "flashrt_node"
NODE_NAME = "flashrt"
PARAMS_FILE = "flashrt.yaml"


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory(PACKAGE), "config", PARAMS_FILE)
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameters file (ros__parameters under /**)"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="true: the node configures and activates itself; false: it waits for "
                                          "a lifecycle manager or `ros2 lifecycle set <node> configure|activate`"),
        DeclareLaunchArgument("log_level", default_value="info",
                              description="debug | info | warn | error | fatal"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="take time from /clock (stamps of observations without a header)"),
        DeclareLaunchArgument("persist_dir", default_value="",
                              description="directory of the capsule log (every step's capsule on disk); empty = off"),
        DeclareLaunchArgument("resume", default_value="false",
                              description="true: continue from the newest capsule in persist_dir's log"),
        DeclareLaunchArgument("role", default_value="primary",
                              description="primary (steps the robot) | replica (rebuilds primary's capsules from its "
                                          "stream, serves list/export/replan) | standby (a replica that takes over)"),
        DeclareLaunchArgument("primary", default_value="",
                              description="role replica or standby: the primary node, e.g. /robot1/flashrt"),
        LifecycleNode(
            package=PACKAGE,
            executable=EXECUTABLE,
            name=NODE_NAME,
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("params_file"), {
                "autostart": ParameterValue(LaunchConfiguration("autostart"), value_type=bool),
                "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
                "persist_dir": ParameterValue(LaunchConfiguration("persist_dir"), value_type=str),
                "resume": ParameterValue(LaunchConfiguration("resume"), value_type=bool),
                "role": ParameterValue(LaunchConfiguration("role"), value_type=str),
                "primary": ParameterValue(LaunchConfiguration("primary"), value_type=str),
            }],
            arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
            output="screen",
            emulate_tty=True,
        ),
    ])
