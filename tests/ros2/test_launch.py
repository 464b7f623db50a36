"""Launch files declare arguments that map onto `tether edge` flags (every flag has one), run the
node as a ROS 2 user expects (`Node(package="tether", executable="edge")`), and install where
`ros2 launch tether ...` looks (the ROS environment .venv/ros, made by `make setup`). The README's
`ros2 launch` line runs as written, in a fresh shell; driving a robot through it is in
test_rclpy_edge.py."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.ros2.edge import _node_parser
from tests.ros2.edge_support import release_token, wait_until
from tests.ros2.ros_env import (
    ROS_PREFIX,
    LaunchOutput,
    ctrl_c,
    kill_launch,
    needs_launch,
    readme_launch,
    ros_env,
    run_readme_launch,
)
from tests.ros2.test_edge_estop import dead_address

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


def _edge_flags() -> set[str]:
    """Every flag of `tether edge` (its argparse parser), less --help and the hidden refused ones."""
    return {flag for action in _node_parser()._actions if action.help != argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction) for flag in action.option_strings}


def test_every_edge_flag_has_its_launch_argument():
    """robot.launch.py declares NAME for each `tether edge --NAME` and passes it as that flag."""
    tree = ast.parse((LAUNCH / "robot.launch.py").read_text())
    flags = _edge_flags()
    assert {"--gateway", "--tls-ca", "--tls-cert", "--tls-key", "--token"} <= flags     # the parser is read
    missing = sorted(f for f in flags if f.removeprefix("--").replace("-", "_") not in _declared(tree))
    assert not missing, f"`tether edge` flags without a robot.launch.py argument: {missing}"
    assert flags <= set(_flags(tree)), f"not passed to the node: {sorted(flags - set(_flags(tree)))}"


def test_the_edge_is_a_ros2_node_of_package_tether():
    """Node(package="tether", executable="edge"): found by ament under <prefix>/lib/tether, no PATH."""
    tree = ast.parse((LAUNCH / "robot.launch.py").read_text())
    nodes = [{k.arg: k.value.value for k in call.keywords if isinstance(k.value, ast.Constant)}
             for call in ast.walk(tree) if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Node"]
    assert [{"package": n.get("package"), "executable": n.get("executable")} for n in nodes] == [
        {"package": "tether", "executable": "edge"}]
    assert not [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "ExecuteProcess"]
    assert os.access(LAUNCH / "edge", os.X_OK), "launch/edge (installed as lib/tether/edge) is not executable"


def test_sim_launch_takes_the_tls_and_token_arguments_and_passes_them_on():
    tree = ast.parse((LAUNCH / "sim.launch.py").read_text())
    secured = {"tls_ca", "tls_cert", "tls_key", "token"}
    assert secured <= set(_declared(tree))
    passed = {k.value for d in ast.walk(tree) if isinstance(d, ast.Dict) for k in d.keys if isinstance(k, ast.Constant)}
    assert secured <= passed, f"declared but not passed to robot.launch.py: {sorted(secured - passed)}"


def test_the_readme_launch_line_uses_declared_arguments():
    """The README's `ros2 launch` line names arguments robot.launch.py has."""
    _, arguments = readme_launch()
    declared = _declared(ast.parse((LAUNCH / "robot.launch.py").read_text()))
    assert arguments and not [a for a in arguments if a.partition(":=")[0] not in declared], arguments


@pytest.mark.parametrize("prefix", [Path(sys.prefix), ROS_PREFIX], ids=["venv", "ros"])
def test_installed_where_ros2_launch_finds_them(prefix):
    marker = prefix / "share/ament_index/resource_index/packages/tether"
    if not marker.exists():
        pytest.skip(f"tether is not installed into {prefix} (run `make setup`)")
    for name in ("launch/robot.launch.py", "launch/sim.launch.py", "config/topic_map.yaml", "config/gazebo_arm.yaml",
                 "config/gz_bridge.yaml"):
        assert (prefix / "share/tether" / name).exists(), name
    assert os.access(prefix / "lib/tether/edge", os.X_OK), "the node executable lib/tether/edge"


@needs_launch
def test_launch_descriptions_load_with_ros2_launch():
    """Each launch file's description loads and lists its arguments (`ros2 launch --show-args`)."""
    for path in FILES:
        proc = subprocess.run(["ros2", "launch", "--show-args", "tether", path.name], env=ros_env(0),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert set(_declared(ast.parse(path.read_text()))) <= set(re.findall(r"^    '(\w+)':", proc.stdout, re.M))


@needs_launch
def test_the_readme_launch_line_starts_the_edge_in_a_fresh_shell(ros_domain, tmp_path):
    """The README's `AMENT_PREFIX_PATH=$PWD/.venv/ros .venv/ros/bin/ros2 launch tether robot.launch.py
    ...` from the repository root in a shell with nothing of Tether's on PATH: ament finds the node
    (lib/tether/edge), which starts on rclpy, says so, waits for its (here: unreachable) gateway,
    and stops cleanly on Ctrl-C. The README's arguments are used, with local values."""
    tokens, _ = release_token(tmp_path)
    local = {"gateway": dead_address(), "release_tokens": str(tokens), "domain_id": str(ros_domain),
             "latch_file": str(tmp_path / "latch.json"), "node_name": "tether_edge_readme"}
    readme = dict(a.split(":=", 1) for a in readme_launch()[1])
    arguments = [f"{k}:={v}" for k, v in {**readme, **local}.items()]
    launch = run_readme_launch(*arguments, domain=ros_domain, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    output = LaunchOutput(launch)
    try:
        wait_until(lambda: "edge node " in output.text or launch.poll() is not None, timeout=60,
                   what="the launched edge node's start line")
        assert launch.poll() is None, output.finish()
        # Ctrl-C in the shell: the whole foreground group
        print(f"\nros2 launch exited {ctrl_c(launch, output, group=True):.2f} s after Ctrl-C")
    finally:
        kill_launch(launch)
    out = output.text
    assert launch.returncode == 0, out
    assert "[edge-1]: process has finished cleanly" in out, out
    start = next(line for line in out.splitlines() if "edge node " in line)
    assert "edge node tether_edge_readme: RclpyTransport" in start, start
    assert f"on domain {ros_domain}" in start and "chunk 20" in start and str(tokens) in start, start
    assert "stopped" in out, out


def test_a_node_whose_launch_is_killed_stops_in_order(ros_domain, tmp_path):
    """`kill -9` of the launch (or the terminal) that reads the node's output: the node's next status
    line fails (broken pipe) and it stops as on Ctrl-C, before its transport closes: the e-stop
    latched as a stop (not as a control-loop failure, which would hold across restarts) and its
    --summary written."""
    latch, summary, log = tmp_path / "latch.json", tmp_path / "summary.json", tmp_path / "edge.log"
    with log.open("w") as stderr:
        node = subprocess.Popen(
            [sys.executable, "-m", "tether", "edge", "--gateway", dead_address(), "--transport", "dds", "--domain-id",
             str(ros_domain), "--status-every", "0.2", "--latch-file", str(latch), "--summary", str(summary)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=LAUNCH.parent)
    try:
        wait_until(lambda: "edge node " in node.stdout.readline() or node.poll() is not None, timeout=30,
                   what="the node's start line")
        node.stdout.close()                                  # what a killed launch leaves the node
        node.wait(timeout=30)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    err = log.read_text()
    assert "tether edge: [Errno 32] Broken pipe" in err and "e-stop latched by the node itself: it stopped" in err, err
    assert json.loads(summary.read_text())["guard"]["estop_reason"] == "edge node tether_edge stopped"
    assert json.loads(latch.read_text())["reason"] == "edge node tether_edge stopped"
