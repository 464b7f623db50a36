"""An export `kill -9`ed while it writes leaves no dataset behind (nothing at the target path, only its staging
folder), and the next export of the same log to the same path sweeps that folder and completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bridge.experience.lerobot import read_lerobot
from tests.support.lerobot_logs import camera_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("fmt", ["lerobot", "foxglove"])
def test_a_killed_export_leaves_nothing_and_the_next_one_completes(tmp_path, fmt):
    items = camera_log(tmp_path / "log", lengths=(40,) * 30)  # 1,200 steps: seconds of work for either format
    out = tmp_path / ("ds" if fmt == "lerobot" else "run.mcap")
    staged = f".{out.name}.staging-*.tmp"
    proc = subprocess.Popen([sys.executable, "-m", "tether", "log", "export", str(tmp_path / "log"), str(out),
                             "--format", fmt], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size for p in tmp_path.glob(f"{staged}/**/*") if p.is_file()) and not (
            fmt == "foxglove" and any(p.stat().st_size for p in tmp_path.glob(staged))):
        assert proc.poll() is None, f"the export ended before it was killed: {proc.stdout.read()!r}"
        assert time.monotonic() < deadline, "the export wrote nothing within 60 s"
        time.sleep(0.005)
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
