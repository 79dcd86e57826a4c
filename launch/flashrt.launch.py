"""Start the flashrt node with config/flashrt.yaml, in an optional namespace.

    ros2 launch flashrt_ros flashrt.launch.py namespace:=robot1 params_file:=/path/to/params.yaml
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription

PACKAGE = "flashrt_ros"
EXECUTABLE = "flashrt_node"
PARAMS_FILE = "flashrt.yaml"


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory(PACKAGE), "config", PARAMS_FILE)
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameters file (ros__parameters under /**)"),
        Node(
            package=PACKAGE,
            executable=EXECUTABLE,
            name="flashrt",
            namespace=LaunchConfiguration("namespace"),
            parameters=[LaunchConfiguration("params_file")],
            output="screen",
            emulate_tty=True,
        ),
    ])
