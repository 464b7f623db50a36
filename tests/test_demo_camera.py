"""`tether demo --camera` as a user runs it: CameraReach robots whose two cameras are rendered offscreen on the CPU,
JPEG to a real gateway, a camera chunk policy in a real tritonserver, its chunks executed tick by tick; a summary
with real figures. Bad flag combinations are refused before anything starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bridge.experience.foxglove import export_foxglove
from bridge.experience.selection import Selection
from tests.test_demo import assert_only_deadline_misses


def test_camera_demo_runs_the_chunk_policy_on_rendered_cameras(tmp_path):
    summary = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "tether", "demo", "--camera", "--envs", "1", "--horizon", "50",
                          "--image-size", "96", "--seconds", "3", "--summary", str(summary), "--run-dir",
                          str(tmp_path / "run"), "--view"], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    data = json.loads(summary.read_text())
    camera = data["camera"]
    assert camera["cameras"] == ["top", "front"] and camera["image_size"] == 96 and camera["horizon"] == 50
    assert_only_deadline_misses(data)
    assert data["sessions"] == 1 and data["steps"] > 50 and data["policy_versions"] == {"1": camera["chunks"]}, data
    # both cameras render every tick; an observation goes out once 25 (H / 2) actions are left: 2 per 50-step episode
    assert camera["frames"] >= 2 * data["steps"] and data["steps"] // 50 <= camera["chunks"] <= data["steps"], data
    assert 0 < camera["render_ms_per_frame"] < 100 and 0 < data["rtt_ms"]["p50"] <= data["rtt_ms"]["p99"]
    assert (tmp_path / "run" / "models" / "camerareach_h50" / "1" / "policy.pt").exists()
    assert "render per frame" in run.stdout and "chunks of 50" in run.stdout
    # --view: `tether view` served beside the gateway; every demo logs, so the run exports for Foxglove afterwards
    assert re.search(r"^view    ws://127\.0\.0\.1:\d+ ", run.stdout, re.M), run.stdout[-2000:]
    info = export_foxglove(tmp_path / "run" / "experience", tmp_path / "run.mcap", selection=Selection())
    assert info["total_frames"] == camera["chunks"], info
    assert [sorted(c) for c in info["cameras"].values()] == [["front", "top"]], info


@pytest.mark.parametrize(("flags", "message"), [
    (["--camera", "--train"], "--camera runs single-env camera sessions: not with --train"),
    (["--camera", "--horizon", "0"], "--horizon must be an integer in [1, 10000], got 0"),
    (["--camera", "--sessions", "2"], "not --sessions"),
    (["--horizon", "50"], "--horizon and --image-size go with --camera"),
])
def test_bad_camera_flags_are_refused_before_anything_starts(tmp_path, flags, message):
    run = subprocess.run([sys.executable, "-m", "tether", "demo", *flags, "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "run").exists()
