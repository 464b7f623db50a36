"""The ROS 2 environment the rclpy tests run processes from: `.venv/ros`, made by `make setup`.

rclpy's Jazzy wheels need numpy 2 and the bundled Triton needs numpy<2, so rclpy lives in its own
virtual environment; the test process (the main one: gateway, Triton, Cyclone DDS) starts rclpy
robots, edge nodes and `ros2 launch` from it as subprocesses. Without it those tests skip and say
why. Every process gets the test's domain id and stays on loopback:

    env = ros_env(domain)            # ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, ...
    subprocess.Popen([str(ROS_PYTHON), "tests/ros2/rclpy_robot.py", "--joints", "a,b"], env=env)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROS_PREFIX = ROOT / ".venv" / "ros"
ROS_PYTHON = ROS_PREFIX / "bin" / "python"
LAUNCH_WHEELS = ROOT.parent / "shared" / "ros2-launch"


def _probe(code: str) -> str | None:
    """None if `code` runs in the ROS environment, else why not."""
    if not ROS_PYTHON.exists():
        return f"{ROS_PREFIX} missing: `make setup` creates it (rclpy from the ros-jazzy-* wheels)"
    proc = subprocess.run([str(ROS_PYTHON), "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return None if proc.returncode == 0 else f"{ROS_PREFIX}: {proc.stderr.strip().splitlines()[-1:]}"


_WHY_NOT_RCLPY = _probe("import rclpy, sensor_msgs.msg, std_msgs.msg, bridge.ros2.rclpy_transport")
_WHY_NOT_LAUNCH = _WHY_NOT_RCLPY or _probe("import launch_ros, ros2launch") and (
    f"ROS 2 launch not installed in {ROS_PREFIX}: `make setup` installs it from the wheels in {LAUNCH_WHEELS}")

needs_rclpy = pytest.mark.skipif(_WHY_NOT_RCLPY is not None, reason=str(_WHY_NOT_RCLPY))
needs_launch = pytest.mark.skipif(_WHY_NOT_LAUNCH is not None, reason=str(_WHY_NOT_LAUNCH))


FASTDDS_PROFILE = ROOT / "launch" / "config" / "fastdds_loopback.xml"


def ros_env(domain: int) -> dict[str, str]:
    """The environment of a ROS 2 process in a test: its domain, loopback only (UDP on 127.0.0.1,
    see fastdds_loopback.xml), Fast DDS."""
    return {**os.environ, "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp", "FASTRTPS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE),
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PATH": f"{ROS_PREFIX / 'bin'}:{os.environ['PATH']}",
            "AMENT_PREFIX_PATH": str(ROS_PREFIX), "ROS_LOG_DIR": os.environ.get("ROS_LOG_DIR", "/tmp/tether-ros-log")}
