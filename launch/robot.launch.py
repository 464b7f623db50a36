"""The Tether edge node on a robot.

    ros2 launch tether robot.launch.py gateway:=10.0.0.5:50051
    ros2 launch tether robot.launch.py gateway:=10.0.0.5:50051 topic_map:=/etc/tether/arm.yaml rate:=200
    ros2 launch tether robot.launch.py gateway:=10.0.0.5:50051 release_tokens:=/etc/tether/release_tokens.json \
        chunk:=20

Declares only: every argument maps onto a flag of `tether edge` (which runs the same node outside
ROS 2). With rclpy importable the node speaks through rclpy (`transport:=auto`).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("gateway", default_value="127.0.0.1:50051",
                              description="gateway address HOST:PORT"),
        DeclareLaunchArgument("topic_map",
                              default_value=PathJoinSubstitution([FindPackageShare("tether"), "config",
                                                                  "topic_map.yaml"]),
                              description="topic map YAML: topics -> observation/action tensors"),
        DeclareLaunchArgument("rate", default_value="100.0", description="control rate in Hz"),
        DeclareLaunchArgument("domain_id", default_value="0", description="ROS 2 domain id"),
        DeclareLaunchArgument("transport", default_value="auto", description="auto | rclpy | dds"),
        DeclareLaunchArgument("policy", default_value="", description="policy name; empty = gateway default"),
        DeclareLaunchArgument("node_name", default_value="tether_edge"),
        DeclareLaunchArgument("deadline_ms", default_value="50.0",
                              description="watchdog: no fresh action this long -> safe action"),
        DeclareLaunchArgument("safe_action", default_value="hold", description="hold | zero | values"),
        DeclareLaunchArgument("release_tokens", default_value="",
                              description="the node's release tokens file (tether edge token add NAME --tokens "
                                          "FILE); empty: every local e-stop release is refused"),
        DeclareLaunchArgument("latch_file", default_value="",
                              description="the e-stop latch kept across restarts; empty: "
                                          "$XDG_STATE_HOME/tether/<node_name>.json (~/.local/state)"),
        DeclareLaunchArgument("session_id", default_value="",
                              description="gateway session id, stable across restarts; empty: <node_name>@<host>"),
        DeclareLaunchArgument("chunk", default_value="0",
                              description="action chunk horizon H (0: one action per observation)"),
        DeclareLaunchArgument("chunk_merge", default_value="newest", description="newest | ensemble"),
        SetEnvironmentVariable("ROS_DOMAIN_ID", LaunchConfiguration("domain_id")),
        ExecuteProcess(
            name=LaunchConfiguration("node_name"),
            cmd=["tether", "edge",
                 "--gateway", LaunchConfiguration("gateway"),
                 "--topic-map", LaunchConfiguration("topic_map"),
                 "--rate", LaunchConfiguration("rate"),
                 "--domain-id", LaunchConfiguration("domain_id"),
                 "--transport", LaunchConfiguration("transport"),
                 "--policy", LaunchConfiguration("policy"),
                 "--node-name", LaunchConfiguration("node_name"),
                 "--deadline-ms", LaunchConfiguration("deadline_ms"),
                 "--safe-action", LaunchConfiguration("safe_action"),
                 "--release-tokens", LaunchConfiguration("release_tokens"),
                 "--latch-file", LaunchConfiguration("latch_file"),
                 "--session-id", LaunchConfiguration("session_id"),
                 "--chunk", LaunchConfiguration("chunk"),
                 "--chunk-merge", LaunchConfiguration("chunk_merge")],
            output="screen",
            sigterm_timeout="5"),
    ])
