"""Processes from the ROS environment for the edge tests: `tether edge --transport rclpy` and the
rclpy robot (rclpy_robot.py), both started with `ros_env(domain)`.

    robot = rclpy_robot(domain, joints, hz=1000)           # an edge_support.Robot
    with EdgeProcess(domain, gateway, tmp_path, "--rate", "1000", "--chunk", "200") as edge:
        ...
    edge.report                                             # the node's --report JSON, after stop
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

from tests.ros2.edge_support import Robot
from tests.ros2.ros_env import ROOT, ROS_PYTHON, ros_env

RCLPY_ROBOT = ROOT / "tests" / "ros2" / "rclpy_robot.py"


def rclpy_robot(domain: int, joints: tuple[str, ...], *, hz: float = 100.0, lockstep: bool = False,
                position: float = 0.0, seconds: float = 60.0) -> Robot:
    argv = [str(ROS_PYTHON), str(RCLPY_ROBOT), "--joints", ",".join(joints), "--hz", str(hz),
            "--position", str(position), "--seconds", str(seconds)] + (["--lockstep"] if lockstep else [])
    robot = Robot(domain, joints, argv=argv, env=ros_env(domain))
    robot.wait_ready(timeout=30)
    return robot


class EdgeProcess:
    """`python -m tether edge` from the ROS environment, stopped with SIGTERM (as Ctrl-C)."""

    def __init__(self, domain: int, gateway: str, tmp_path: Path, *flags: str, transport: str = "rclpy",
                 python: Path = ROS_PYTHON):
        """`python`: the ROS environment's (rclpy), or the test's own for `--transport dds` (Cyclone)."""
        self.report_path = tmp_path / f"edge_report_{domain}.json"
        self.argv = [str(python), "-m", "tether", "edge", "--gateway", gateway, "--transport", transport,
                     "--domain-id", str(domain), "--node-name", "tether_edge", "--status-s", "1",
                     "--report", str(self.report_path), "--latch-file", str(tmp_path / f"latch_{domain}.json"),
                     *flags]
        self.env = ros_env(domain)
        self.report: dict | None = None
        self.output: list[str] = []

    def __enter__(self) -> EdgeProcess:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=ROOT)
        self._started = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._started.wait(30):
            self.stop()
            raise AssertionError(f"edge did not start: {self.text}")
        return self

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("edge node "):
                self._started.set()

    @property
    def text(self) -> str:
        return "".join(self.output)

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.returncode == 0, f"edge exited {self.proc.returncode}: {self.text}"
        self.report = json.loads(self.report_path.read_text())
        return self.report

    def __exit__(self, *exc: object) -> None:
        if self.report is None:
            self.stop()
