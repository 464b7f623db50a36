"""`tether log export --format lerobot`: a camera robot's log as a LeRobotDataset v3.0 that LeRobot 0.4.4's own
loader reads back (in its environment, .venv/lerobot), and that `read_lerobot` turns back into Transitions."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from bridge.experience import lerobot
from bridge.experience.lerobot import export_lerobot, is_lerobot_dataset, read_lerobot
from bridge.experience.selection import Selection
from bridge.experience.tool import export, main
from protos import codec
from tests.support.lerobot_logs import LENGTHS, camera_log, lerobot_side

CAMERAS = {"observation.images.front": "front", "observation.images.wrist": "wrist"}
# AV1 (libsvtav1, CRF 30, yuv420p: LeRobot's own settings) on these 64x48 pictures: ~3.1 levels of 255 measured
MEAN_LEVELS, FRAME_LEVELS = 6.0, 10.0


def _decoded(t, name):
    return codec.decode(next(x for x in t.observation if x.name == name))


def _applied(t):
    return codec.decode((t.applied_action or t.action)[0])


@pytest.mark.parametrize("roll", [False, True], ids=["one-file", "a-file-per-episode"])
def test_lerobots_loader_reads_the_export_back(tmp_path, monkeypatch, roll):
    items = camera_log(tmp_path / "log")
    if roll:  # files roll over past LeRobot's sizes: here after every episode
        monkeypatch.setattr(lerobot, "DATA_MB", 0)
        monkeypatch.setattr(lerobot, "VIDEO_MB", 0)
    info = export_lerobot(tmp_path / "log", tmp_path / "ds", selection=Selection())
    files = 3 if roll else 1
    assert len(list((tmp_path / "ds/data").glob("chunk-000/*.parquet"))) == files
    assert all(len(list((tmp_path / "ds/videos" / k).glob("chunk-000/*.mp4"))) == files for k in CAMERAS)
    assert (info["total_episodes"], info["total_frames"], info["fps"]) == (3, 60, 30)
    assert info["cameras"] == list(CAMERAS) and info["skipped"] == 0 and info["first_skipped"] is None
    np.savez(tmp_path / "frames.npz", **{k: np.stack([_decoded(t, n) for t in items]) for k, n in CAMERAS.items()})
    lr = lerobot_side("check", str(tmp_path / "ds"), "--frames", str(tmp_path / "frames.npz"))
    assert (lr["episodes"], lr["frames"], lr["fps"], lr["lengths"]) == (3, 60, 30, list(LENGTHS))
    assert lr["actions"] == [_applied(t).tolist() for t in items]           # exact: what the robot applied
    assert lr["video_keys"] == list(CAMERAS) and set(lr["codecs"].values()) == {"av1"}
    assert lr["tasks"] == ["mujoco:CameraReach-v0"]
    assert lr["stats_keys"] == sorted(lr["features"])                       # stats.json covers every feature
    assert max(lr["stats_diff"].values()) < 1e-5, lr["stats_diff"]           # = LeRobot's compute_episode_stats
    assert max(lr["mean_abs_error"].values()) < MEAN_LEVELS, lr["mean_abs_error"]
    assert max(lr["max_frame_error"].values()) < FRAME_LEVELS, lr["max_frame_error"]


def test_read_lerobot_gives_the_logged_steps_back(tmp_path):
    items = camera_log(tmp_path / "log")
    export_lerobot(tmp_path / "log", tmp_path / "ds", selection=Selection())
    export(tmp_path / "log", tmp_path / "npz")  # the npz layout has a meta/info.json too, without codebase_version
    assert is_lerobot_dataset(tmp_path / "ds") and not is_lerobot_dataset(tmp_path / "log")
    assert not is_lerobot_dataset(tmp_path / "npz")
    back = read_lerobot(tmp_path / "ds")
    assert len(back) == len(items)
    ends = np.cumsum(LENGTHS) - 1
    for i, (t, b) in enumerate(zip(items, back, strict=True)):
        assert (b.offset, b.episode, b.step, b.source) == (i, t.episode, i - sum(LENGTHS[:t.episode]), "lerobot:ds")
        assert [x.name for x in b.observation] == ["observation", "front", "wrist"]
        assert np.array_equal(_decoded(b, "observation"), _decoded(t, "observation"))
        assert np.array_equal(_applied(b), _applied(t)) and np.array_equal(codec.decode(b.action[0]),
                                                                           codec.decode(t.action[0]))
        assert (b.intervention, b.reward, b.policy_version) == (t.intervention, t.reward, t.policy_version)
        assert b.timing.gateway_recv_ns == t.timing.gateway_recv_ns
        for name in ("front", "wrist"):
            err = np.abs(_decoded(b, name).astype(int) - _decoded(t, name).astype(int)).mean()
            assert err < FRAME_LEVELS, (i, name, err)
        # the last step: episode 0 terminated, 1 truncated, 2 was still open (comes back truncated: it was cut)
        assert (b.terminated, b.truncated) == ((i == ends[0]), (i in ends[1:]))


def test_the_layout_is_lerobots_v3(tmp_path, capsys):
    camera_log(tmp_path / "log")
    summary = export_lerobot(tmp_path / "log", tmp_path / "ds", selection=Selection(), progress_s=1e-9)
    assert "lerobot export: 1 episodes, 20 frames" in capsys.readouterr().err  # the status line, per progress_s
    assert summary["fps_source"] == "median step interval of timing.t_sent_ns" and summary["video_bytes"] > 0
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["tether"]["fps"] == summary["fps_source"] and info["total_frames"] == 60
    assert info["codebase_version"] == "v3.0" and info["fps"] == 30 and info["splits"] == {"train": "0:3"}
    ft = info["features"]
    names = [f"observation_{i}" for i in range(4)]
    assert ft["observation.state"] == {"dtype": "float32", "shape": [4], "names": names}
    assert ft["observation.images.front"]["info"] == {
        "video.height": 48, "video.width": 64, "video.codec": "av1", "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False, "video.fps": 30, "video.channels": 3, "has_audio": False}
    assert {k: ft[k]["dtype"] for k in ("action", "policy_action", "intervention", "next.reward", "next.done",
                                        "next.truncated", "policy_version", "timestamp_ns")} == {
        "action": "float32", "policy_action": "float32", "intervention": "bool", "next.reward": "float32",
        "next.done": "bool", "next.truncated": "bool", "policy_version": "int64", "timestamp_ns": "int64"}
    eps = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["dataset_from_index"], e["dataset_to_index"], e["length"]) for e in eps] == [
        (0, 20, 20), (20, 35, 15), (35, 60, 25)]
    for key in CAMERAS:  # one video per camera, the episodes one after another
        spans = [t for e in eps for t in (e[f"videos/{key}/from_timestamp"], e[f"videos/{key}/to_timestamp"])]
        assert spans == pytest.approx([0, 20 / 30, 20 / 30, 35 / 30, 35 / 30, 2.0])
        assert (tmp_path / f"ds/videos/{key}/chunk-000/file-000.mp4").is_file()
    assert [e["tether/complete"] for e in eps] == [True, True, False]
    data = pq.read_table(tmp_path / "ds/data/chunk-000/file-000.parquet").to_pydict()
    assert data["index"] == list(range(60)) and data["timestamp"][:3] == pytest.approx([0, 1 / 30, 2 / 30])
    assert data["intervention"].count(True) == 2 and data["next.done"].count(True) == 2
    assert data["action"][23] == [103.0, 97.0] and data["policy_action"][23] == [3.0, -3.0]  # a person acted
    stats = json.loads((tmp_path / "ds/meta/stats.json").read_text())
    assert stats["index"]["count"] == [60] and np.shape(stats["observation.images.front"]["mean"]) == (3, 1, 1)
    assert (tmp_path / "ds/meta/tasks.parquet").is_file()


def test_the_selection_flags_reach_the_export(tmp_path, capsys):
    camera_log(tmp_path / "log")

    def export(*flags):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        main(["export", str(tmp_path / "log"), str(out), "--format", "lerobot", *flags])
        assert "wrote" in capsys.readouterr().out
        return json.loads((out / "meta/info.json").read_text())["total_episodes"]

    assert export("--interventions-only") == 1                   # episode 1 only: a person acted in it
    assert export("--versions", "2:3") == 2                      # episodes 1 and 2
    assert export("--complete-only", "--versions", "2:") == 1
    assert export("--policy", "someone-else") == 0


def test_an_explicit_rate_and_codec(tmp_path):
    items = camera_log(tmp_path / "log", lengths=(6,))
    summary = export_lerobot(tmp_path / "log", tmp_path / "ds", selection=Selection(), fps=15, codec="libx264")
    assert (summary["fps"], summary["fps_source"]) == (15, "given")
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["fps"] == 15 and info["features"]["observation.images.wrist"]["info"]["video.codec"] == "h264"
    back = read_lerobot(tmp_path / "ds")
    assert len(back) == 6 and back[5].terminated and np.array_equal(_applied(back[5]), _applied(items[5]))
