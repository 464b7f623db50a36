"""The Tether edge node wired to a simulator that publishes ROS 2 topics: Gazebo through
ros_gz_bridge, or Isaac Sim's ROS 2 bridge (which publishes /joint_states itself).

    ros2 launch tether sim.launch.py gateway:=127.0.0.1:50051 gz_bridge:=true \\
        gz_joint_state:=/world/default/model/ur5e/joint_state

Declares only: simulated time, the optional Gazebo bridge, and the same edge node as
robot.launch.py with the same arguments.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("gateway", default_value="127.0.0.1:50051", description="gateway HOST:PORT"),
        DeclareLaunchArgument("topic_map",
                              default_value=PathJoinSubstitution([FindPackageShare("tether"), "config",
                                                                  "topic_map.yaml"])),
        DeclareLaunchArgument("rate", default_value="100.0", description="control rate in Hz"),
        DeclareLaunchArgument("domain_id", default_value="0", description="ROS 2 domain id"),
        DeclareLaunchArgument("gz_bridge", default_value="false",
                              description="start ros_gz_bridge for Gazebo joint states and commands"),
        DeclareLaunchArgument("gz_joint_state", default_value="/world/default/model/robot/joint_state",
                              description="Gazebo joint state topic, bridged to /joint_states"),
        Node(package="ros_gz_bridge", executable="parameter_bridge", name="tether_gz_bridge",
             condition=IfCondition(LaunchConfiguration("gz_bridge")),
             arguments=[[LaunchConfiguration("gz_joint_state"), "@sensor_msgs/msg/JointState[gz.msgs.Model"],
                        "/policy_controller/commands@std_msgs/msg/Float64MultiArray]gz.msgs.Double_V"],
             remappings=[(LaunchConfiguration("gz_joint_state"), "/joint_states")],
             parameters=[{"use_sim_time": True}]),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([FindPackageShare("tether"), "launch",
                                                                "robot.launch.py"])),
            launch_arguments={"gateway": LaunchConfiguration("gateway"),
                              "topic_map": LaunchConfiguration("topic_map"),
                              "rate": LaunchConfiguration("rate"),
                              "domain_id": LaunchConfiguration("domain_id")}.items()),
    ])
