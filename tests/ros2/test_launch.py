"""Launch files declare arguments that map onto `tether edge` flags, and install where
`ros2 launch tether ...` looks (the ROS environment .venv/ros, made by `make setup`). Running one
against a robot is in test_rclpy_edge.py."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.ros2.edge import _node_parser
from tests.ros2.ros_env import ROS_PREFIX, needs_launch, ros_env

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
FILES = sorted(LAUNCH.glob("*.launch.py"))


def _declared(tree: ast.AST) -> list[str]:
    return [call.args[0].value for call in ast.walk(tree) if isinstance(call, ast.Call)
            and getattr(call.func, "id", "") == "DeclareLaunchArgument"]


def _flags(tree: ast.AST) -> list[str]:
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--")]


def test_there_are_robot_and_sim_launch_files():
    assert {f.name for f in FILES} == {"robot.launch.py", "sim.launch.py"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_launch_file_declares_and_only_uses_real_edge_flags(path):
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    declared = _declared(tree)
    assert {"gateway", "topic_map", "rate", "domain_id"} <= set(declared), declared
    known = {flag for action in _node_parser()._actions for flag in action.option_strings}
    unknown = [flag for flag in _flags(tree) if flag not in known]
    assert not unknown, f"{path.name} passes flags `tether edge` does not have: {unknown}"
    # launch files declare: no loops, no conditionals, no arithmetic
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.For | ast.While | ast.If | ast.BinOp)]


def test_every_declared_robot_argument_reaches_the_edge_command():
    tree = ast.parse((LAUNCH / "robot.launch.py").read_text())
    flags = {flag.removeprefix("--").replace("-", "_") for flag in _flags(tree)}
    assert set(_declared(tree)) == flags


@pytest.mark.parametrize("prefix", [Path(sys.prefix), ROS_PREFIX], ids=["venv", "ros"])
def test_installed_where_ros2_launch_finds_them(prefix):
    marker = prefix / "share/ament_index/resource_index/packages/tether"
    if not marker.exists():
        pytest.skip(f"tether is not installed into {prefix} (run `make setup`)")
    for name in ("launch/robot.launch.py", "launch/sim.launch.py", "config/topic_map.yaml", "config/gazebo_arm.yaml",
                 "config/gz_bridge.yaml"):
        assert (prefix / "share/tether" / name).exists(), name


@needs_launch
def test_launch_descriptions_load_with_ros2_launch():
    """Each launch file's description loads and lists its arguments (`ros2 launch --show-args`)."""
    for path in FILES:
        proc = subprocess.run(["ros2", "launch", "--show-args", "tether", path.name], env=ros_env(0),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert set(_declared(ast.parse(path.read_text()))) <= set(re.findall(r"^    '(\w+)':", proc.stdout, re.M))
