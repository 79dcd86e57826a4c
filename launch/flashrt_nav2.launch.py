"""flashrt under nav2's lifecycle manager: the node waits unconfigured, the manager brings it up.

    ros2 launch flashrt_ros flashrt_nav2.launch.py namespace:=robot1

nav2's lifecycle_manager also expects a bond (a heartbeat) from every node it manages; flashrt makes
none, so the manager gets bond_timeout 0.0 (bonds off), or it aborts the bring-up after 4 s. Needs
nav2_lifecycle_manager (ros-humble-nav2-lifecycle-manager), which flashrt itself does not depend on.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node

from launch import LaunchDescription

PACKAGE = "flashrt_ros"
BOND_TIMEOUT_S = 0.0  # flashrt speaks no bond: 0.0 turns the manager's bond check off


def generate_launch_description():
    namespace = LaunchConfiguration("namespace")
    flashrt = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(os.path.join(get_package_share_directory(PACKAGE), "launch",
                                                   "flashrt.launch.py")),
        launch_arguments={"namespace": namespace, "autostart": "false",
                          "params_file": LaunchConfiguration("params_file")}.items())
    manager = Node(package="nav2_lifecycle_manager", executable="lifecycle_manager", namespace=namespace,
                   name="lifecycle_manager_flashrt", output="screen",
                   parameters=[{"node_names": [PythonExpression(["'", namespace, "/flashrt'.lstrip('/')"])],
                                "autostart": True, "bond_timeout": BOND_TIMEOUT_S}])
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="namespace of flashrt and its manager"),
        DeclareLaunchArgument("params_file", default_value=os.path.join(
            get_package_share_directory(PACKAGE), "config", "flashrt.yaml"), description="flashrt's parameters"),
        flashrt, manager])
