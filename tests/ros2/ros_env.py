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
import signal
import subprocess
import threading
import time
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


README_LAUNCH = "AMENT_PREFIX_PATH=$PWD/.venv/ros .venv/ros/bin/ros2 launch tether robot.launch.py"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def readme_launch() -> tuple[str, list[str]]:
    """The robot's `ros2 launch` line as the docs write it (README.md, else docs/*.md): the shell
    invocation up to `robot.launch.py`, and its NAME:=VALUE arguments (`[...]` optional ones too)."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text().replace("\\\n", " ") if doc.exists() else ""
        for line in text.splitlines():
            if README_LAUNCH in line:
                rest = line[line.index(README_LAUNCH) + len(README_LAUNCH):]
                return README_LAUNCH, [a.strip("[]") for a in rest.split() if ":=" in a]
    raise AssertionError(f"no line `{README_LAUNCH} ...` in README.md or docs/: the robot's launch line moved")


def fresh_shell_env(domain: int) -> dict[str, str]:
    """A login shell's environment, nothing of Tether's on it (no .venv on PATH, no PYTHONPATH), plus
    only what keeps a test's DDS traffic to itself: loopback discovery and the Fast DDS loopback
    profile, and the test's domain (the launch's `domain_id:=` argument sets it for the node too)."""
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8",
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "FASTRTPS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE),
            "ROS_LOG_DIR": os.environ.get("ROS_LOG_DIR", "/tmp/tether-ros-log"), "ROS_DOMAIN_ID": str(domain)}


def run_readme_launch(*arguments: str, domain: int, **popen) -> subprocess.Popen:
    """`ros2 launch tether robot.launch.py ...` exactly as the docs' line runs it, from the
    repository root in a fresh shell (`fresh_shell_env`), with these NAME:=VALUE arguments."""
    invocation, _ = readme_launch()
    return subprocess.Popen(["bash", "-c", f'{invocation} "$@"', "bash", *arguments], cwd=ROOT,
                            env=fresh_shell_env(domain), **popen)


class LaunchOutput:
    """What a `ros2 launch` process (started with stdout=PIPE, text=True) prints, read on a thread as
    it comes, so the pipe never fills and blocks launch while a test waits on something else.

        output = LaunchOutput(launch)
        wait_until(lambda: "edge node " in output.text or launch.poll() is not None, ...)
        print(f"exited {ctrl_c(launch, output, group=True):.2f} s after Ctrl-C")
    """

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._thread.start()

    @property
    def text(self) -> str:
        return "".join(list(self.lines))

    def finish(self, timeout: float = 10.0) -> str:
        """Everything, once the process has exited (the rest of the pipe read)."""
        self._thread.join(timeout)
        return self.text


def ctrl_c(launch: subprocess.Popen, output: LaunchOutput, *, group: bool, timeout: float = 30.0) -> float:
    """Ctrl-C a `ros2 launch` started with `start_new_session=True`: SIGINT to its whole process group
    as a terminal does (`group=True`), or to launch alone as a supervisor's `kill -INT` does (launch
    must pass it on); the seconds until it exited. Not gone within `timeout`: its group is killed,
    its nodes with it, and the test fails with everything it printed."""
    start = time.monotonic()
    if group:
        os.killpg(launch.pid, signal.SIGINT)
    else:
        launch.send_signal(signal.SIGINT)
    try:
        launch.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()
        raise AssertionError(f"ros2 launch had not exited {timeout:g} s after Ctrl-C; its output:\n"
                             f"{output.finish()}") from None
    output.finish()
    return time.monotonic() - start


def kill_launch(launch: subprocess.Popen) -> None:
    """A test's last word on a launch it started with `start_new_session=True`: its group SIGKILLed, if alive."""
    if launch.poll() is None:
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()


def ros_env(domain: int) -> dict[str, str]:
    """The environment of a ROS 2 process in a test: its domain, loopback only (UDP on 127.0.0.1,
    see fastdds_loopback.xml), Fast DDS."""
    return {**os.environ, "ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp", "FASTRTPS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE),
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PATH": f"{ROS_PREFIX / 'bin'}:{os.environ['PATH']}",
            "AMENT_PREFIX_PATH": str(ROS_PREFIX), "ROS_LOG_DIR": os.environ.get("ROS_LOG_DIR", "/tmp/tether-ros-log")}
