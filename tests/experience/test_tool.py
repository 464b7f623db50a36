"""`tether log inspect|export` on a small real log."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from bridge.common.errors import CommandError
from bridge.experience import ExperienceLog
from bridge.experience.selection import Selection
from bridge.experience.tool import export, inspect, main
from protos import codec
from tests.experience.helpers import transition


def make_run(run_dir):
    """Two sessions: s0 runs episodes of 5 steps (terminated, then truncated, then 3 steps still open);
    s1 one episode of 4 steps with a 8x8 camera image, by policy version 2."""
    items = []
    for ep, (length, end) in enumerate([(5, "terminated"), (5, "truncated"), (3, None)]):
        for k in range(length):
            step = ep * 5 + k
            t = transition("s0", step, episode=ep, reward=float(step), version=1)
            t.intervention = ep == 0 and k in (1, 2)  # a person's command acted at steps 1 and 2
            if k == length - 1 and end:
                setattr(t, end, True)
                t.next_observation.append(codec.encode("observation", np.zeros(11, np.float32)))
            items.append(t)
    for k in range(4):
        items.append(transition("s1", k, reward=0.5, version=2, image=(8, 8, 3), last=(k == 3)))

    async def write():
        async with ExperienceLog(run_dir / "experience", segment_bytes=6 << 10) as log:
            await asyncio.gather(*(log.append(t) for t in items))

    asyncio.run(write())
    return items


def test_inspect_summarises_the_log(tmp_path, capsys):
    items = make_run(tmp_path)
    s = inspect(tmp_path)
    assert (s["transitions"], s["sessions"], s["episodes"], s["completed_episodes"]) == (len(items), 2, 4, 3)
    assert s["offsets"] == [0, len(items) - 1]
    assert s["policy_versions"] == {"pi:1": 13, "pi:2": 4} and s["reward_versions"] == {"r1": 17}
    assert s["interventions"] == 2
    assert s["returns"]["max"] == sum(range(5, 10)) and s["returns"]["min"] == 2.0
    assert len(s["segments"]) > 1 and all(seg["finished"] for seg in s["segments"])
    assert s["bytes"] == sum(p.stat().st_size for p in (tmp_path / "experience").iterdir())
    main(["inspect", str(tmp_path / "experience"), "--json"])
    assert json.loads(capsys.readouterr().out)["transitions"] == len(items)
    main(["inspect", str(tmp_path)])
    table = capsys.readouterr().out
    assert "pi:2" in table and "sessions            2" in table


def test_export_writes_a_flat_per_episode_dataset(tmp_path):
    make_run(tmp_path)
    info = export(tmp_path, tmp_path / "out")
    assert (info["total_episodes"], info["total_frames"]) == (4, 17)
    episodes = [json.loads(x) for x in (tmp_path / "out/meta/episodes.jsonl").read_text().splitlines()]
    assert [(e["session"], e["episode"], e["length"], e["complete"]) for e in episodes] == [
        ("s0", 0, 5, True), ("s0", 1, 5, True), ("s1", 0, 4, True), ("s0", 2, 3, False)]
    ep0 = np.load(tmp_path / "out/data/chunk-000/episode_000000.npz")
    assert ep0["observation.observation"].shape == (5, 11) and ep0["action.action"].shape == (5, 3)
    assert ep0["reward"].tolist() == [0, 1, 2, 3, 4] and ep0["terminated"].tolist() == [False] * 4 + [True]
    assert ep0["next_observation.observation"].shape == (1, 11)
    assert np.isnan(ep0["log_prob"]).all() and ep0["episode_index"].tolist() == [0] * 5
    assert ep0["intervention"].tolist() == [False, True, True, False, False]
    cam = np.load(tmp_path / "out/data/chunk-000/episode_000002.npz")
    assert cam["observation.image"].shape == (4, 8, 8, 3) and cam["observation.image"].dtype == np.uint8
    assert cam["observation.image"][1].tobytes() == transition("s1", 1, image=(8, 8, 3)).observation[1].data
    assert info["features"]["observation.image"] == {"dtype": "uint8", "shape": [8, 8, 3]}
    only = export(tmp_path, tmp_path / "complete", selection=Selection(complete_only=True))
    assert only["total_episodes"] == 3


def test_bad_paths_are_named_and_nothing_is_half_written(tmp_path):
    make_run(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep")
    with pytest.raises(CommandError, match="taken"):
        main(["export", str(tmp_path), str(tmp_path / "taken")])
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
    with pytest.raises(CommandError, match="nowhere"):
        main(["inspect", str(tmp_path / "nowhere")])
    with pytest.raises(CommandError, match="no experience log"):
        main(["inspect", str(tmp_path / "taken")])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary directory was left"


def test_the_tether_log_command(tmp_path):
    import subprocess
    import sys

    make_run(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tether", "log", "inspect", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out)["transitions"] == 17
    done = subprocess.run([sys.executable, "-m", "tether", "log", "export", str(tmp_path), str(tmp_path / "bc")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "4 episodes, 17 frames" in done.stdout, done.stderr
    bad = subprocess.run([sys.executable, "-m", "tether", "log", "inspect", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "missing: no such directory" in bad.stderr
