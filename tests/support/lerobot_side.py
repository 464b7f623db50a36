"""Runs in LeRobot's own environment (.venv/lerobot: lerobot 0.4.4, torch, torchcodec), never imports Tether; the
tests call it as a subprocess and read the JSON it prints on stdout.

    .venv/lerobot/bin/python tests/support/lerobot_side.py check DATASET [--frames FRAMES.npz]
    .venv/lerobot/bin/python tests/support/lerobot_side.py make DATASET --episodes 6 --steps 40 --gain '[[...]]'

check: what LeRobot's loader makes of a dataset: `LeRobotDatasetMetadata` (info, tasks, episodes, stats), a
`LeRobotDataset` built on it (which loads the parquet with the features of info.json), every item read (videos
decoded by torchcodec at from_timestamp + timestamp, within its 1e-4 s tolerance), items read again with
delta_timestamps (its neighbour queries and padding), and its own `compute_episode_stats` of episode 0 against the
stats stored for it. With --frames (an npz {"<video key>": uint8 (N, H, W, 3) in index order}): the mean absolute
error of the decoded frames, in pixel levels.

make: a dataset written by LeRobot's own writer (`LeRobotDataset.create`, add_frame, save_episode, finalize): a
scripted linear demonstrator, action = gain @ state, on a 4-d state that it drives, and one camera whose picture
follows the state; prints what LeRobot's loader decodes of it (frames saved to DATASET.frames.npz).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np


def _stats_diff(root: Path, ds, frames: dict[str, np.ndarray] | None) -> dict[str, float]:
    """The largest |LeRobot's episode-0 stat - the stored one| per feature (images: not std, see lerobot_stats)."""
    import pyarrow.parquet as pq
    from lerobot.datasets.compute_stats import compute_episode_stats, get_feature_stats

    row = pq.read_table(sorted((root / "meta/episodes").glob("*/*.parquet"))[0]).to_pylist()[0]
    ep = ds.hf_dataset.with_format(None).select(range(row["dataset_from_index"], row["dataset_to_index"]))
    feats = {k: f for k, f in ds.meta.features.items() if f["dtype"] not in ("video", "image", "string")}
    data = {k: np.asarray(ep[k], dtype=f["dtype"]) for k, f in feats.items() if k in ep.column_names}
    theirs = compute_episode_stats(data, feats)
    for key, video in (frames or {}).items():  # what compute_episode_stats does with the images of an episode
        n = row["length"]
        picked = np.round(np.linspace(0, n - 1, n if n < 100 else max(100, min(int(n ** 0.75), 10000)))).astype(int)
        s = get_feature_stats(video[:n][picked].transpose(0, 3, 1, 2), axis=(0, 2, 3), keepdims=True)
        theirs[key] = {k: v if k == "count" else np.squeeze(v / 255.0, axis=0) for k, v in s.items() if k != "std"}
    out = {}
    for key, stats in theirs.items():
        out[key] = max(float(np.max(np.abs(np.asarray(row[f"stats/{key}/{s}"], np.float64)
                                           - np.asarray(v, np.float64)))) for s, v in stats.items())
    return out


def check(root: Path, frames_path: Path | None) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata("local/check", root=root)
    ds = LeRobotDataset("local/check", root=root)
    fps, videos = ds.meta.fps, ds.meta.video_keys
    frames = dict(np.load(frames_path)) if frames_path else None
    lengths: dict[int, int] = {}
    actions, errors = [], {k: [] for k in videos}
    decoded = {k: [] for k in videos}
    for i in range(len(ds)):
        item = ds[i]
        ep, fi = int(item["episode_index"]), int(item["frame_index"])
        assert int(item["index"]) == i, f"item {i} has index {int(item['index'])}"
        assert abs(float(item["timestamp"]) - fi / fps) < 1e-4, f"item {i}: timestamp {float(item['timestamp'])}"
        lengths[ep] = lengths.get(ep, 0) + 1
        actions.append(item["action"].reshape(-1).tolist())
        for k in videos:
            image = (item[k].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            decoded[k].append(image)
            if frames is not None:
                errors[k].append(float(np.abs(image.astype(np.int16) - frames[k][i].astype(np.int16)).mean()))
    # neighbours by delta_timestamps: LeRobot's check_delta_timestamps, its padding at episode edges, video queries
    deltas = {"action": [0.0, 1 / fps, 2 / fps], **{k: [-1 / fps, 0.0] for k in videos}}
    shifted = LeRobotDataset("local/check", root=root, delta_timestamps=deltas)
    for i in sorted({0, len(shifted) // 2, len(shifted) - 1}):
        item = shifted[i]
        assert tuple(item["action"].shape)[0] == 3 and all(tuple(item[k].shape)[0] == 2 for k in videos)
    return {"episodes": meta.total_episodes, "frames": meta.total_frames, "fps": fps, "video_keys": videos,
            "features": sorted(meta.features), "lengths": [lengths[e] for e in sorted(lengths)],
            "tasks": list(meta.tasks.index), "actions": actions,
            "stats_keys": sorted(meta.stats or {}), "stats_diff": _stats_diff(root, ds, frames),
            "mean_abs_error": {k: float(np.mean(v)) for k, v in errors.items() if v},
            "max_frame_error": {k: float(np.max(v)) for k, v in errors.items() if v},
            "codecs": {k: meta.features[k]["info"]["video.codec"] for k in videos}}


def scene(state: np.ndarray, h: int = 48, w: int = 64) -> np.ndarray:
    """A smooth picture that follows the state: a bright blob at (state[0], state[1]), bands moved by state[2]."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy = w / 2 + 12 * np.tanh(state[0]), h / 2 + 9 * np.tanh(state[1])
    blob = 180 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / 60)
    r = 40 + blob
    g = 90 + 50 * np.sin(x / 8 + state[2])
    b = 120 + 60 * np.cos(y / 6 - state[3])
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def make(root: Path, *, episodes: int, steps: int, gain: np.ndarray, seed: int) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(seed)
    features = {
        "observation.state": {"dtype": "float32", "shape": (4,), "names": ["x", "y", "vx", "vy"]},
        "observation.images.top": {"dtype": "video", "shape": (48, 64, 3), "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["ax", "ay"]},
    }
    ds = LeRobotDataset.create("local/demo", fps=30, features=features, root=root, use_videos=True)
    raw = []
    for _ in range(episodes):
        state = rng.uniform(-1, 1, 4).astype(np.float32)
        for _ in range(steps):
            action = (gain @ state).astype(np.float32)
            image = scene(state)
            raw.append(image)
            ds.add_frame({"observation.state": state.copy(), "observation.images.top": image, "action": action,
                          "task": "reach the target"})
            # a damped point mass pushed by the action, with noise so the states cover the space
            pos, vel = state[:2], state[2:]
            vel = 0.9 * vel + 0.1 * action + rng.normal(0, 0.05, 2).astype(np.float32)
            state = np.concatenate([pos + 0.1 * vel, vel]).astype(np.float32)
        ds.save_episode()
    ds.finalize()
    result = check(root, None)
    loaded = LeRobotDataset("local/demo", root=root)
    images = np.stack([(loaded[i]["observation.images.top"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
                       for i in range(len(loaded))])
    np.savez(str(root) + ".frames.npz", top=images, raw=np.stack(raw))
    result["writer_error"] = float(np.abs(images.astype(np.int16) - np.stack(raw).astype(np.int16)).mean())
    return result


def main() -> None:
    logging.disable(logging.WARNING)
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("root", type=Path)
    c.add_argument("--frames", type=Path)
    m = sub.add_parser("make")
    m.add_argument("root", type=Path)
    m.add_argument("--episodes", type=int, default=6)
    m.add_argument("--steps", type=int, default=40)
    m.add_argument("--gain", type=json.loads, required=True)
    m.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.command == "check":
        out = check(a.root, a.frames)
    else:
        out = make(a.root, episodes=a.episodes, steps=a.steps, gain=np.asarray(a.gain, np.float32), seed=a.seed)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
