"""The Tether edge node on a robot: the ROS 2 node `tether`/`edge` (`<prefix>/lib/tether/edge`).

    ros2 launch tether robot.launch.py gateway:=10.0.0.5:50051
    ros2 launch tether robot.launch.py gateway:=10.0.0.5:50051 topic_map:=/etc/tether/arm.yaml rate:=200
    ros2 launch tether robot.launch.py gateway:=gw.cell4:50051 tls_ca:=/etc/tether/ca.pem \\
        tls_cert:=/etc/tether/robot.pem tls_key:=/etc/tether/robot.key release_tokens:=/etc/tether/release_tokens.json
    TETHER_TOKEN=arm1.SECRET ros2 launch tether robot.launch.py gateway:=gw.cell4:50051 tls_ca:=/etc/tether/ca.pem

Declares only: every argument is the `tether edge` flag of the same name (`--tls-ca` is `tls_ca`;
tests/ros2/test_launch.py checks each flag has one), and an empty value means the flag's default.
A robot token is better given as $TETHER_TOKEN (the launch passes its environment on) than as
`token:=`, which every process listing shows. With rclpy importable the node speaks through rclpy
(`transport:=auto`).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from bridge.ros2.launch_signals import sigint_without_keyboard_interrupt


def generate_launch_description():
    return LaunchDescription([
        sigint_without_keyboard_interrupt(),     # Ctrl-C always reaches the shutdown
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
        DeclareLaunchArgument("node_name", default_value="tether_edge", description="the ROS 2 node name"),
        DeclareLaunchArgument("watchdog_ms", default_value="50.0",
                              description="watchdog: no fresh action this long -> safe action"),
        DeclareLaunchArgument("safe_action", default_value="hold", description="hold | zero | values"),
        DeclareLaunchArgument("max_delta", default_value="",
                              description="largest command change per step (one value or one per joint); empty: none"),
        DeclareLaunchArgument("velocity_limit", default_value="",
                              description="largest command change per second; empty: the topic map's, else 0.5"),
        DeclareLaunchArgument("chunk", default_value="0",
                              description="action chunk horizon H (0: one action per observation)"),
        DeclareLaunchArgument("chunk_threshold", default_value="",
                              description="request the next chunk with this many actions left; empty: H // 2"),
        DeclareLaunchArgument("chunk_merge", default_value="newest", description="newest | ensemble"),
        DeclareLaunchArgument("ensemble_decay", default_value="0.01", description="ensembling weight exp(-decay * i)"),
        DeclareLaunchArgument("chunk_prefix", default_value="false",
                              description="send the committed actions and the delay d (action_prefix, action_delay) "
                                          "for a policy that inpaints them (real-time chunking)"),
        DeclareLaunchArgument("chunk_blend", default_value="",
                              description="blend each chunk's seam over this many ticks; empty: 0 with chunk_prefix, "
                                          "else H // 4"),
        DeclareLaunchArgument("status_every", default_value="5.0", description="seconds between status lines"),
        DeclareLaunchArgument("tls_ca", default_value="",
                              description="CA of the gateway's certificate (turns TLS on); empty: plaintext, "
                                          "which the gateway accepts from loopback only"),
        DeclareLaunchArgument("tls_cert", default_value="",
                              description="this robot's certificate, its identity (mTLS; tether certs init)"),
        DeclareLaunchArgument("tls_key", default_value="", description="the certificate's private key"),
        DeclareLaunchArgument("token", default_value="",
                              description="robot token NAME.SECRET; empty: $TETHER_TOKEN (preferred: "
                                          "an argument shows in process listings)"),
        DeclareLaunchArgument("summary", default_value="",
                              description="on stop, write the node's counts and commands to this JSON file"),
        DeclareLaunchArgument("session_id", default_value="",
                              description="gateway session id, stable across restarts; empty: <node_name>@<host>"),
        DeclareLaunchArgument("latch_file", default_value="",
                              description="the e-stop latch kept across restarts; empty: "
                                          "$XDG_STATE_HOME/tether/<node_name>.json (~/.local/state)"),
        DeclareLaunchArgument("release_tokens", default_value="",
                              description="the node's release tokens file (tether edge token add NAME --tokens "
                                          "FILE); empty: every local e-stop release is refused"),
        SetEnvironmentVariable("ROS_DOMAIN_ID", LaunchConfiguration("domain_id")),
        Node(
            package="tether", executable="edge", name=LaunchConfiguration("node_name"),
            arguments=["--gateway", LaunchConfiguration("gateway"),
                       "--topic-map", LaunchConfiguration("topic_map"),
                       "--rate", LaunchConfiguration("rate"),
                       "--domain-id", LaunchConfiguration("domain_id"),
                       "--transport", LaunchConfiguration("transport"),
                       "--policy", LaunchConfiguration("policy"),
                       "--node-name", LaunchConfiguration("node_name"),
                       "--watchdog-ms", LaunchConfiguration("watchdog_ms"),
                       "--safe-action", LaunchConfiguration("safe_action"),
                       "--max-delta", LaunchConfiguration("max_delta"),
                       "--velocity-limit", LaunchConfiguration("velocity_limit"),
                       "--chunk", LaunchConfiguration("chunk"),
                       "--chunk-threshold", LaunchConfiguration("chunk_threshold"),
                       "--chunk-merge", LaunchConfiguration("chunk_merge"),
                       "--ensemble-decay", LaunchConfiguration("ensemble_decay"),
                       "--chunk-prefix", LaunchConfiguration("chunk_prefix"),
                       "--chunk-blend", LaunchConfiguration("chunk_blend"),
                       "--status-every", LaunchConfiguration("status_every"),
                       "--tls-ca", LaunchConfiguration("tls_ca"),
                       "--tls-cert", LaunchConfiguration("tls_cert"),
                       "--tls-key", LaunchConfiguration("tls_key"),
                       "--token", LaunchConfiguration("token"),
                       "--summary", LaunchConfiguration("summary"),
                       "--session-id", LaunchConfiguration("session_id"),
                       "--latch-file", LaunchConfiguration("latch_file"),
                       "--release-tokens", LaunchConfiguration("release_tokens")],
            output="screen",
            sigterm_timeout="5"),
    ])
