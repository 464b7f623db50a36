"""The Tether edge node wired to a simulator that publishes ROS 2 topics: Gazebo through
ros_gz_bridge (the default), or Isaac Sim's ROS 2 bridge (which publishes /joint_states itself).

    # Gazebo running a world `default` with the model `arm` (launch/config/gazebo_arm.yaml):
    ros2 launch tether sim.launch.py gateway:=127.0.0.1:50051
    # another Gazebo robot: your copies of the bridge list and the topic map
    ros2 launch tether sim.launch.py gateway:=127.0.0.1:50051 \\
        gz_bridge_config:=/path/gz_bridge.yaml topic_map:=/path/topic_map.yaml
    # Isaac Sim (no ros_gz_bridge)
    ros2 launch tether sim.launch.py gz_bridge:=false topic_map:=/path/isaac_topic_map.yaml
    # a secured gateway on another machine (robot token from $TETHER_TOKEN, or token:=)
    ros2 launch tether sim.launch.py gateway:=gw.lab:50051 tls_ca:=ca.pem tls_cert:=sim.pem tls_key:=sim.key

Declares only: the Gazebo bridge (ros_gz_bridge's parameter_bridge with the topics listed in
gz_bridge_config: /clock, joint states, one position command per joint; simulated time), and the
same edge node as robot.launch.py with its arguments (the ones declared here are listed by
`--show-args`; robot.launch.py's others, such as `chunk:=20`, pass through as well).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from bridge.ros2.launch_signals import sigint_without_keyboard_interrupt


def generate_launch_description():
    config = PathJoinSubstitution([FindPackageShare("tether"), "config"])
    return LaunchDescription([
        sigint_without_keyboard_interrupt(),     # Ctrl-C always reaches the shutdown
        DeclareLaunchArgument("gateway", default_value="127.0.0.1:50051", description="gateway HOST:PORT"),
        DeclareLaunchArgument("topic_map", default_value=PathJoinSubstitution([config, "gazebo_arm.yaml"]),
                              description="topic map YAML (default: the Gazebo arm, as ros_gz_bridge publishes it)"),
        DeclareLaunchArgument("rate", default_value="100.0", description="control rate in Hz"),
        DeclareLaunchArgument("domain_id", default_value="0", description="ROS 2 domain id"),
        DeclareLaunchArgument("release_tokens", default_value="",
                              description="the node's release tokens file; empty: local e-stop releases refused"),
        DeclareLaunchArgument("latch_file", default_value="",
                              description="the e-stop latch kept across restarts; empty: under $XDG_STATE_HOME"),
        DeclareLaunchArgument("tls_ca", default_value="",
                              description="CA of the gateway's certificate (turns TLS on); empty: plaintext"),
        DeclareLaunchArgument("tls_cert", default_value="", description="this client's certificate (mTLS)"),
        DeclareLaunchArgument("tls_key", default_value="", description="the certificate's private key"),
        DeclareLaunchArgument("token", default_value="", description="robot token NAME.SECRET; empty: $TETHER_TOKEN"),
        DeclareLaunchArgument("gz_bridge", default_value="true",
                              description="start ros_gz_bridge (false for simulators that speak ROS 2 themselves)"),
        DeclareLaunchArgument("gz_bridge_config", default_value=PathJoinSubstitution([config, "gz_bridge.yaml"]),
                              description="ros_gz_bridge config_file: the bridged topics (match the topic map)"),
        Node(package="ros_gz_bridge", executable="parameter_bridge", name="tether_gz_bridge",
             condition=IfCondition(LaunchConfiguration("gz_bridge")),
             parameters=[{"config_file": LaunchConfiguration("gz_bridge_config"), "use_sim_time": True}],
             output="screen"),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(PathJoinSubstitution([FindPackageShare("tether"), "launch",
                                                                "robot.launch.py"])),
            launch_arguments={"gateway": LaunchConfiguration("gateway"),
                              "topic_map": LaunchConfiguration("topic_map"),
                              "rate": LaunchConfiguration("rate"),
                              "domain_id": LaunchConfiguration("domain_id"),
                              "release_tokens": LaunchConfiguration("release_tokens"),
                              "latch_file": LaunchConfiguration("latch_file"),
                              "tls_ca": LaunchConfiguration("tls_ca"),
                              "tls_cert": LaunchConfiguration("tls_cert"),
                              "tls_key": LaunchConfiguration("tls_key"),
                              "token": LaunchConfiguration("token")}.items()),
    ])
