"""LeRobot export and import on bad input: a clear error naming the file or feature, nothing half-written."""

from __future__ import annotations

import json
import shutil

import pytest

from bridge.common.errors import CommandError
from bridge.experience.lerobot import export_lerobot, read_lerobot
from bridge.experience.selection import Selection
from bridge.experience.tool import main
from protos import codec
from tests.support.lerobot_logs import camera_transitions, write_log
from trainer.sources import LogDataset
from trainer.worker import check, parser

WRIST = "videos/observation.images.wrist/chunk-000/file-000.mp4"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot-errors")
    write_log(root / "log", camera_transitions())
    export_lerobot(root / "log", root / "ds", selection=Selection())
    return root / "ds"


def _copy(dataset, tmp_path):
    shutil.copytree(dataset, tmp_path / "ds")
    return tmp_path / "ds"


def _leftovers(parent, name):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_an_export_into_a_non_empty_folder_fails_before_writing(dataset, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_lerobot(dataset.parent / "log", tmp_path / "out", selection=Selection())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"] and not _leftovers(tmp_path, "out")
    with pytest.raises(CommandError, match="not an empty directory"):
        main(["export", str(dataset.parent / "log"), str(tmp_path / "out"), "--format", "lerobot"])


@pytest.mark.parametrize("option, message", [({"fps": 29.97}, "fps 29.97"), ({"codec": "vp9"}, "codec 'vp9'")])
def test_bad_export_options_are_refused_up_front(dataset, tmp_path, option, message):
    with pytest.raises(ValueError, match=message):
        export_lerobot(dataset.parent / "log", tmp_path / "out", selection=Selection(), **option)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path, "out")


def test_a_failed_export_leaves_nothing_behind(tmp_path):
    items = camera_transitions()
    for t in items:
        if t.episode == 2:  # the third episode's action is named otherwise: found after two episodes were written
            t.action[0].name = "command"
    write_log(tmp_path / "log", items)
    with pytest.raises(ValueError, match="offset 35: action is missing"):
        export_lerobot(tmp_path / "log", tmp_path / "out", selection=Selection())
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path, "out")
    odd = camera_transitions((4,), session="odd", shape=(47, 64))  # yuv420p needs even sides
    write_log(tmp_path / "odd", odd)
    with pytest.raises(ValueError, match="a 64x47 camera: yuv420p video needs even"):
        export_lerobot(tmp_path / "odd", tmp_path / "out", selection=Selection())
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path, "out")


@pytest.mark.parametrize("damage, message", [
    (lambda ds: (ds / "meta/info.json").unlink(), r"meta/info.json: missing \(not a LeRobotDataset\)"),
    (lambda ds: _edit_info(ds, lambda i: i.update(codebase_version="v2.1")), "codebase_version 'v2.1'"),
    (lambda ds: _edit_info(ds, lambda i: i["features"]["observation.state"].update(shape=[5])),
     r"file-000.parquet: feature 'observation.state': rows of 4 values, info.json's shape is \[5\]"),
    (lambda ds: _edit_info(ds, lambda i: i["features"].update(extra={"dtype": "float32", "shape": [2]})),
     "feature 'extra' .* has no column"),
    (lambda ds: (ds / WRIST).unlink(), r"file-000.mp4: missing \(video of 'observation.images.wrist', episode 0\)"),
    (lambda ds: _truncate(ds / WRIST), "file-000.mp4: (does not decode|no frame at)"),
    (lambda ds: shutil.rmtree(ds / "meta/episodes"), "no episodes parquet files"),
    (lambda ds: (ds / "data/chunk-000/file-000.parquet").unlink(), r"file-000.parquet: missing \(data file"),
])
def test_a_malformed_dataset_is_refused_naming_the_part(dataset, tmp_path, damage, message):
    ds = _copy(dataset, tmp_path)
    damage(ds)
    with pytest.raises(ValueError, match=message):
        read_lerobot(ds)


def test_the_trainer_refuses_a_malformed_dataset_too(dataset, tmp_path):
    ds = _copy(dataset, tmp_path)
    (ds / WRIST).unlink()
    with pytest.raises(ValueError, match="file-000.mp4: missing"):
        LogDataset(ds)
    assert len(LogDataset(dataset)) == 60 and codec.decode(LogDataset(dataset).transitions[0].observation[1]).shape \
        == (48, 64, 3)


def test_bc_takes_one_of_experience_dir_or_demos(tmp_path):
    def checked(*argv):
        return check(parser().parse_args(["--steps", "1", *argv]))

    assert checked("--algo", "bc", "--demos", str(tmp_path)).demos == [str(tmp_path)]
    with pytest.raises(SystemExit, match="one of --experience-dir DIR"):
        checked("--algo", "bc", "--demos", str(tmp_path), "--experience-dir", str(tmp_path))
    with pytest.raises(SystemExit, match="one of --experience-dir DIR"):
        checked("--algo", "bc")
    with pytest.raises(SystemExit, match="--demos DIR"):
        checked("--algo", "bc", "--demos", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="SAC's"):
        checked("--algo", "ppo", "--gateway", "127.0.0.1:1", "--demos", str(tmp_path))


def _edit_info(ds, change):
    info = json.loads((ds / "meta/info.json").read_text())
    change(info)
    (ds / "meta/info.json").write_text(json.dumps(info))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
