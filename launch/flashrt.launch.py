"""Start the flashrt lifecycle node with config/flashrt.yaml, in an optional namespace.

    ros2 launch flashrt_ros flashrt.launch.py namespace:=robot1 params_file:=/path/to/params.yaml

Arguments: namespace, params_file, log_level, and six that set a node parameter of the same name: autostart,
use_sim_time, persist_dir, resume, role, primary. Each of those six overrides the params file only when given;
left out (or empty), the params file's value stands, or the node's default where the file has none.

A replica on a workstation (what-ifs off the robot) and a hot standby (takes over if the policy process
dies), each rebuilding the robot's capsules from its ~/capsule_stream (README: "Replicas and failover"):

    ros2 launch flashrt_ros flashrt.launch.py namespace:=ws role:=replica primary:=/robot1/flashrt
    ros2 launch flashrt_ros flashrt.launch.py namespace:=robot1_standby role:=standby primary:=/robot1/flashrt

Crash-resume on a robot: give the capsule log a directory on the robot's disk and turn resume on, so
a node restarted after an OOM kill, a watchdog or a power cut continues from its last persisted step:

    ros2 launch flashrt_ros flashrt.launch.py persist_dir:=/var/lib/flashrt resume:=true

Bringing the node up:
- autostart:=true (the node's default): the node configures and activates itself (its ``autostart``
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
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue

from launch import LaunchDescription

PACKAGE = "flashrt_ros"
EXECUTABLE = "flashrt_node"
NODE_NAME = "flashrt"
PARAMS_FILE = "flashrt.yaml"
# launch arguments that set the node parameter of the same name: (its type, what it says). Each is passed only
# when given, so that a params file's `role: standby` or `persist_dir: /var/lib/flashrt` is not replaced by a
# launch default
PARAMETER_ARGUMENTS = {
    "autostart": (bool, "true (the node's default): the node configures and activates itself; false: it waits for "
                        "a lifecycle manager or `ros2 lifecycle set <node> configure|activate`"),
    "use_sim_time": (bool, "true: take time from /clock (stamps of observations without a header)"),
    "persist_dir": (str, "directory of the capsule log (every step's capsule on disk); the node's default is off"),
    "resume": (bool, "true: continue from the newest capsule in persist_dir's log"),
    "role": (str, "primary (the node's default: steps the robot) | replica (rebuilds primary's capsules from its "
                  "stream, serves list/export/replan) | standby (a replica that takes over)"),
    "primary": (str, "role replica or standby: the primary node, e.g. /robot1/flashrt"),
}
FROM_FILE = " (left out: the params file's value, else the node's default)"


def _flashrt_node(context):
    overrides = {name: ParameterValue(LaunchConfiguration(name), value_type=value_type)
                 for name, (value_type, _) in PARAMETER_ARGUMENTS.items() if LaunchConfiguration(name).perform(context)}
    return [LifecycleNode(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=NODE_NAME,
        namespace=LaunchConfiguration("namespace"),
        parameters=[LaunchConfiguration("params_file")] + ([overrides] if overrides else []),  # later wins
        arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
        output="screen",
        emulate_tty=True,
    )]


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory(PACKAGE), "config", PARAMS_FILE)
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameters file (ros__parameters under /**)"),
        DeclareLaunchArgument("log_level", default_value="info",
                              description="debug | info | warn | error | fatal"),
        *[DeclareLaunchArgument(name, default_value="", description=description + FROM_FILE)
          for name, (_, description) in PARAMETER_ARGUMENTS.items()],
        OpaqueFunction(function=_flashrt_node),
    ])
