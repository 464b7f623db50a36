"""Ctrl-C a busy `ros2 launch` many times and count the launches that never exit (not a test: a
measurement, minutes long). The launch relays a node printing RATE lines/s, as sim.launch.py relays
gz_bridge_robot.py's line per command, and gets SIGINT alone (a supervisor's `kill -INT`) at a
random moment; a launch not gone in --timeout s counts as hung (its group is then killed).

    .venv/bin/python tests/ros2/launch_ctrl_c_stress.py --runs 100                        # Tether's launch files
    .venv/bin/python tests/ros2/launch_ctrl_c_stress.py --runs 100 --keyboard-interrupt   # launch as it comes

With --keyboard-interrupt the launch file leaves out `sigint_without_keyboard_interrupt()`
(bridge.ros2.launch_signals), so SIGINT raises KeyboardInterrupt in launch as well.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAUNCH_FILE = '''
from launch import LaunchDescription
from launch.actions import ExecuteProcess

from bridge.ros2.launch_signals import sigint_without_keyboard_interrupt

CHATTY = ("import sys, time\\n"
          "while True:\\n"
          "    print('{{\\"t\\": %f, \\"joint\\": \\"j\\", \\"data\\": 0.125}}' % time.monotonic(), flush=True)\\n"
          "    time.sleep({period})\\n")


def generate_launch_description():
    return LaunchDescription([{first}ExecuteProcess(cmd=["python3", "-c", CHATTY], output="screen", name="chatty"),
                              ExecuteProcess(cmd=["sleep", "600"], output="screen", name="quiet")])
'''


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.ros2.ros_env import LaunchOutput, ctrl_c, kill_launch, ros_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--rate", type=float, default=5000.0, help="lines per second the relayed node prints")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds after Ctrl-C before a launch counts as hung")
    p.add_argument("--keyboard-interrupt", action="store_true", help="without sigint_without_keyboard_interrupt()")
    a = p.parse_args(argv)
    path = Path(tempfile.mkdtemp(prefix="ctrl_c_stress")) / "chatty.launch.py"
    path.write_text(LAUNCH_FILE.format(period=1.0 / a.rate,
                                       first="" if a.keyboard_interrupt else "sigint_without_keyboard_interrupt(), "))
    exits: list[float] = []
    hung = 0
    for run in range(a.runs):
        launch = subprocess.Popen(["ros2", "launch", str(path)], env=ros_env(random.randrange(1, 233)),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True)
        output = LaunchOutput(launch)
        try:
            deadline = time.monotonic() + 60
            while output.text.count('"t"') < 20 and launch.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(random.uniform(0.0, 0.5))
            exits.append(ctrl_c(launch, output, group=False, timeout=a.timeout))
        except AssertionError as exc:
            hung += 1
            print(f"run {run}: hung; launch printed (its nodes' lines left out):\n" + "".join(
                line for line in str(exc).splitlines(keepends=True) if '"t"' not in line), flush=True)
        finally:
            kill_launch(launch)
    print(f"{'launch':<40} {'runs':>5} {'hung':>5} {'exit p50 s':>11} {'exit max s':>11}")
    name = "as it comes (KeyboardInterrupt)" if a.keyboard_interrupt else "with sigint_without_keyboard_interrupt"
    print(f"{name:<40} {a.runs:>5} {hung:>5} {statistics.median(exits) if exits else float('nan'):>11.2f} "
          f"{max(exits, default=float('nan')):>11.2f}")


if __name__ == "__main__":
    main()
