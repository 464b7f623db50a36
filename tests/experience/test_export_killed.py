"""An export `kill -9`ed while it writes leaves no dataset behind (nothing at the target path, only its staging
folder), and the next export of the same log to the same path sweeps that folder and completes.

The exporting process stops itself (SIGSTOP) once it has taken its 10th episode, and says so: the kill lands in
the middle of the export whatever the machine's load, not when a poll happens to catch it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bridge.experience.lerobot import read_lerobot
from tests.support.lerobot_logs import camera_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the export as `tether log export` runs it, its episode walk wrapped to stop the process at the 10th episode
STOPPING_EXPORT = """
import os, signal, sys
from pathlib import Path
import bridge.experience.{module} as exporter
from bridge.experience.selection import Selection
walk = exporter.logged_episodes

def stopping(*args, **kw):
    for ep in walk(*args, **kw):
        if ep.index == 10:
            print("stopping", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        yield ep

exporter.logged_episodes = stopping
exporter.export_{module}(Path(sys.argv[1]), Path(sys.argv[2]), selection=Selection())
"""


@pytest.mark.parametrize("fmt", ["lerobot", "foxglove"])
def test_a_killed_export_leaves_nothing_and_the_next_one_completes(tmp_path, fmt):
    items = camera_log(tmp_path / "log", lengths=(40,) * 30)
    out = tmp_path / ("ds" if fmt == "lerobot" else "run.mcap")
    staged = f".{out.name}.staging-*.tmp"
    proc = subprocess.Popen([sys.executable, "-c", STOPPING_EXPORT.format(module=fmt), str(tmp_path / "log"),
                             str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline() == "stopping\n", f"the export ended first (exit {proc.wait()})"
        assert any(p.stat().st_size for p in tmp_path.glob(f"{staged}/**/*") if p.is_file()) or any(
            p.stat().st_size for p in tmp_path.glob(staged) if p.is_file())          # 10 episodes written
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert not out.exists() and len(list(tmp_path.glob(staged))) == 1   # half a dataset, never at the target

    run = subprocess.run([sys.executable, "-m", "tether", "log", "export", str(tmp_path / "log"), str(out),
                          "--format", fmt], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "wrote 30 episodes, 1200 frames" in run.stdout
    assert not list(tmp_path.glob(staged))                                # the killed one's leftovers swept
    if fmt == "lerobot":
        back = read_lerobot(out)
        assert len(back) == len(items) == 1200
        assert [t.episode for t in back] == [i // 40 for i in range(1200)]
