"""The policy in the loop with the simulated arm: flashrt-sim (MuJoCo Pusher, the /clock source) and the flashrt
lifecycle node stepping on its observations, both in one namespace.

    ros2 launch flashrt_ros flashrt_sim.launch.py namespace:=sim seed:=3

flashrt-sim publishes observation (std_msgs/Float32MultiArray, 21 channels) and joint_states, and takes the
policy's action_trajectory (JointTrajectory, the arm's joint names) as joint targets. The policy node reads
params_file, then policy_path (by default the shipped policy trained on the sim's expert), then the overrides below
that wire it to the arm; it runs on sim time.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue

from launch import LaunchDescription

PACKAGE = "flashrt_ros"
ARM_JOINTS = ["r_shoulder_pan_joint", "r_shoulder_lift_joint", "r_upper_arm_roll_joint", "r_elbow_flex_joint",
              "r_forearm_roll_joint", "r_wrist_flex_joint", "r_wrist_roll_joint"]  # flashrt_ros.sim.world
# what the policy node needs to step on the arm: its observation (flashrt_ros.sim.world.OBS_NAMES) and its joints
POLICY_OVERRIDES = {"observation_type": "float32_array", "obs_dim": 21, "action_dim": 7, "publish_trajectory": True,
                    "action_joint_names": ARM_JOINTS, "control_period_s": 0.01, "use_sim_time": True}


def generate_launch_description():
    namespace = LaunchConfiguration("namespace")
    sim = Node(package=PACKAGE, executable="flashrt-sim", name="flashrt_sim", namespace=namespace, output="screen",
               parameters=[{"seed": ParameterValue(LaunchConfiguration("seed"), value_type=int),
                            "expert": ParameterValue(LaunchConfiguration("expert"), value_type=bool)}])
    policy_path = {"policy_path": ParameterValue(LaunchConfiguration("policy_path"), value_type=str)}
    policy = LifecycleNode(package=PACKAGE, executable="flashrt_node", name="flashrt", namespace=namespace,
                           parameters=[LaunchConfiguration("params_file"), policy_path, POLICY_OVERRIDES],
                           output="screen")
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="sim", description="namespace of both nodes and topics"),
        DeclareLaunchArgument("params_file", default_value=os.path.join(
            get_package_share_directory(PACKAGE), "config", "flashrt.yaml"), description="the policy's parameters"),
        DeclareLaunchArgument("policy_path", default_value=os.path.join(
            get_package_share_directory(PACKAGE), "config", "policies", "pusher.safetensors"),
            description="the policy file (trained on the sim's expert: docs/sim.md); '' = params_file's architecture"),
        DeclareLaunchArgument("seed", default_value="0", description="the first episode's seed"),
        DeclareLaunchArgument("expert", default_value="false",
                              description="true: the scripted expert drives the arm (the policy only watches)"),
        sim, policy])
