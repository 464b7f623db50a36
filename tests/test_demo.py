"""`tether demo` as a user runs it: a summary with real figures, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> set[int]:
    """All descendants of `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_writes_a_summary_of_a_real_closed_loop(tmp_path):
    summary = tmp_path / "out" / "summary.json"
    run = subprocess.run([sys.executable, "-m", "tether", "demo", "--env", "InvertedPendulum-v5", "--envs", "2",
                          "--seconds", "3", "--summary", str(summary), "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(summary.read_text())
    assert data["sessions"] == 1 and data["envs_per_session"] == 2 and data["errors"] == 0  # one vectorised session
    assert data["steps"] > 100 and data["steps_per_s"] > 30
    assert 0 < data["rtt_ms"]["p50"] <= data["rtt_ms"]["p99"]
    assert data["triton_version"] == "2.51.0"
    assert "round trip p99" in run.stdout and "steps/s" in run.stdout
    assert not list(summary.parent.glob(".*tmp*")), "a temporary summary file was left behind"


def test_demo_with_a_newton_task_in_vectorised_sessions(tmp_path):
    """`--env newton:<task>`: the policy's specs come from the vector env; M sessions of N worlds each."""
    summary = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "tether", "demo", "--env", "newton:cartpole", "--envs", "16",
                          "--sessions", "2", "--seconds", "2", "--summary", str(summary), "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(summary.read_text())
    assert data["sessions"] == 2 and data["envs_per_session"] == 16 and data["errors"] == 0
    assert data["steps"] >= 32 * 10 and data["steps"] % 16 == 0 and data["episodes"] > 0
    assert "2 vectorised session(s) x 16 envs of newton:cartpole" in run.stdout


def test_ctrl_c_stops_everything(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tether", "demo", "--envs", "2", "--seconds", "60",
                             "--run-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        for line in proc.stdout:  # wait until the loop runs
            if line.lstrip().startswith("sim ") and "steps" in line or time.monotonic() > deadline:
                break
        children = _children(proc.pid)
        assert len(children) >= 2, "expected tritonserver and the gateway under the demo"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15  # they got the SIGINT too: wait until they are gone (bounded)
        while (left := [pid for pid in children if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"processes outlived the demo by 15 s: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
