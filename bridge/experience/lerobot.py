"""LeRobotDataset v3.0 out of an experience log, and Transitions out of a LeRobotDataset v3.0 folder.

    info = export_lerobot(log_dir, Path("out/ds"), selection=Selection(complete_only=True))  # tether log export
    for t in iter_lerobot(Path("out/ds")):          # or read_lerobot(...): a list; any v3.0 folder, LeRobot's too
        t.observation, t.applied_action, t.reward, t.terminated

The layout is what lerobot 0.4.4 writes and reads (`LeRobotDataset(repo_id, root=...)` loads ours):
`meta/info.json` (codebase_version "v3.0", fps, features), `meta/stats.json`, `meta/tasks.parquet`,
`meta/episodes/chunk-000/file-000.parquet` (per episode: length, dataset_from/to_index, its data file, per camera
its video file and from/to timestamps, its stats), `data/chunk-CCC/file-FFF.parquet` (several episodes per file),
`videos/observation.images.<camera>/chunk-CCC/file-FFF.mp4` (episodes one after another; bridge.experience.video).

Names: an observation's uint8 (H, W, 3) tensor is a camera, `observation.images.<name>` (a video); the tensor
"observation" is `observation.state`; any other observation tensor `observation.<name>`. `action` is what the
robot applied (Transition.applied_action, else action); Tether's extras: `policy_action` (the policy's own),
`intervention`, `next.reward`, `next.done` (terminated or truncated), `next.truncated`, `policy_version`,
`timestamp_ns` (the gateway's receive time of the step), `log_offset`. A tensor of another rank than 1 is
flattened (`tether_shape` in its feature keeps the shape); mono cameras (H, W, 1) are such tensors, not videos.

Alignment: frames are aligned by step: frame i of an episode, in the data and in every camera's video, is step i;
`timestamp` = frame_index / fps as LeRobot expects (fps: the median step interval of the first episode, rounded to
an integer, or `fps=`), the step's own time is kept in `timestamp_ns`. A file rolls over past LeRobot's sizes
(`data_files_size_in_mb` 100, `video_files_size_in_mb` 200; 1000 files per chunk); the episodes' metadata is one
file. Not exported: reward terms, log-probabilities, next_observation, guard reports.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bridge.common.files import staged_dir
from bridge.experience.lerobot_stats import aggregate, episode_stats, to_json
from bridge.experience.selection import LoggedEpisode, Selection, Skips, logged_episodes
from protos import bridge_pb2, codec, experience_pb2

if TYPE_CHECKING:
    import pyarrow as pa

    from bridge.experience.video import FrameCursor

__all__ = ["CODEBASE_VERSION", "export_lerobot", "is_lerobot_dataset", "iter_lerobot", "read_lerobot"]

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE, DATA_MB, VIDEO_MB = 1000, 100, 200
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
PROGRESS_S = 10.0
DEFAULT_FPS = 30  # a log without step times, or of single-step episodes only
_INDEX = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
          "task_index": "int64"}
_EXTRAS = {"next.reward": "float32", "next.done": "bool", "next.truncated": "bool", "intervention": "bool",
           "policy_version": "int64", "timestamp_ns": "int64", "log_offset": "int64"}


def _arrow():
    """pyarrow and pyarrow.parquet, imported when a dataset is written or read (the interop extra): importing this
    module (`is_lerobot_dataset`) needs neither them nor PyAV."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ImportError(f"LeRobotDataset export/import needs pyarrow and av (pip install 'tether[interop]'): "
                          f"{exc}") from None
    return pyarrow, pyarrow.parquet


def is_lerobot_dataset(path: str | Path) -> bool:
    """Whether `path` is a folder with LeRobot's `meta/info.json` (one with a codebase_version, any: `iter_lerobot`
    checks it; `tether log export`'s npz layout has an info.json without one)."""
    try:
        return "codebase_version" in json.loads((Path(path) / "meta" / "info.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


# ---------------------------------------------------------------- export


def _key(group: str, name: str, camera: bool) -> str:
    if group == "observation":
        return f"observation.images.{name}" if camera else "observation.state" if name == "observation" \
            else f"observation.{name}"
    prefix = "action" if group == "applied" else "policy_action"
    return prefix if name == "action" else f"{prefix}.{name}"


class _Plan:
    """The features of the first transition: {key: (group, tensor name, dtype, tensor shape, camera)}."""

    def __init__(self, t: experience_pb2.Transition):
        self.columns: dict[str, tuple[str, str, np.dtype, tuple[int, ...], bool]] = {}
        for group, tensors in (("observation", t.observation), ("applied", t.applied_action or t.action),
                               ("policy", t.action)):
            for x in tensors:
                dtype, shape = codec.dtype_to_numpy(x.dtype), tuple(x.shape)
                camera = group == "observation" and dtype == np.uint8 and len(shape) == 3 and shape[2] == 3
                key = _key(group, x.name, camera)
                if key in self.columns:
                    raise ValueError(f"offset {t.offset}: {group} tensor {x.name!r} and another both map to {key!r}")
                self.columns[key] = (group, x.name, dtype, shape, camera)
        if "action" not in self.columns or "policy_action" not in self.columns:
            raise ValueError(f"offset {t.offset}: LeRobot's `action` is the tensor named 'action' (or the only one); "
                             f"the transition has {[x.name for x in (t.applied_action or t.action)]}")
        self.cameras = [k for k, c in self.columns.items() if c[4]]

    def features(self, video_info: dict[str, dict]) -> dict[str, dict]:
        out = {}
        for key, (_, name, dtype, shape, camera) in self.columns.items():
            if camera:
                out[key] = {"dtype": "video", "shape": list(shape), "names": ["height", "width", "channels"],
                            "info": video_info.get(key)}
                continue
            size = int(np.prod(shape))
            out[key] = {"dtype": dtype.name, "shape": [size], "names": [f"{name}_{i}" for i in range(size)]
                        if size > 1 else None}
            if list(shape) != [size]:
                out[key]["tether_shape"] = list(shape)
        return {**out, **{k: {"dtype": d, "shape": [1], "names": None} for k, d in {**_EXTRAS, **_INDEX}.items()}}

    def arrays(self, ep: LoggedEpisode) -> dict[str, np.ndarray]:
        """{key: (n, ...) array} of one episode (cameras (n, H, W, 3) uint8, the rest (n, size))."""
        out = {}
        for key, (group, name, dtype, shape, camera) in self.columns.items():
            rows = []
            for t in ep.transitions:
                tensors = {"observation": t.observation, "applied": t.applied_action or t.action,
                           "policy": t.action}[group]
                x = next((x for x in tensors if x.name == name), None)
                if x is None or tuple(x.shape) != shape or codec.dtype_to_numpy(x.dtype) != dtype:
                    got = "missing" if x is None else f"{codec.dtype_to_numpy(x.dtype).name}{list(x.shape)}"
                    raise ValueError(f"session {ep.session!r} episode {ep.episode} offset {t.offset}: {key} is "
                                     f"{got}, the first transition's {dtype.name}{list(shape)}")
                rows.append(codec.decode(x))
            out[key] = np.stack(rows) if camera else np.stack(rows).reshape(len(rows), -1)
        return out


def _fps(ep: LoggedEpisode) -> tuple[int, str] | None:
    """(the rate of the episode's steps, how it was found), None for a single step (no interval to measure)."""
    if len(ep.transitions) < 2:
        return None
    for field in ("t_sent_ns", "gateway_recv_ns"):
        stamps = np.array([getattr(t.timing, field) for t in ep.transitions], np.int64)
        if stamps.all() and (steps := np.diff(stamps)[np.diff(stamps) > 0]).size:
            return max(1, round(1e9 / float(np.median(steps)))), f"median step interval of timing.{field}"
    return DEFAULT_FPS, "default (the log has no step times)"


def _array(a: np.ndarray, dtype: str) -> pa.Array:
    pa, _ = _arrow()
    if a.ndim == 1 or a.shape[1] == 1:
        return pa.array(a.reshape(-1).astype(dtype))
    return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1).astype(dtype)), a.shape[1])


def _next_file(chunk: int, file: int) -> tuple[int, int]:
    return (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)


class _Export:
    def __init__(self, root: Path, *, fps: int | None, codec_name: str, crf: int, task: str | None):
        self.root, self.fps, self.codec, self.crf, self.task = root, fps, codec_name, crf, task
        self.plan: _Plan | None = None
        self.frames = 0
        self.episodes: list[dict] = []
        self.stats: list[dict] = []
        self.tasks: dict[str, int] = {}
        self.data = {"chunk": 0, "file": 0, "bytes": 0, "writer": None}
        self.videos: dict[str, dict] = {}
        self.video_info: dict[str, dict] = {}
        self.video_bytes = 0

    def add(self, ep: LoggedEpisode) -> None:
        if self.plan is None:
            self.plan = _Plan(ep.transitions[0])
        arrays = self.plan.arrays(ep)
        n, first = len(ep.transitions), self.frames
        task = self.task or ep.transitions[0].source or "tether"
        task_index = self.tasks.setdefault(task, len(self.tasks))
        ts = np.array([t.timing.gateway_recv_ns or t.timing.t_sent_ns for t in ep.transitions], np.int64)
        columns = {k: a for k, a in arrays.items() if k not in self.plan.cameras}
        columns.update({
            "next.reward": np.array([t.reward for t in ep.transitions], np.float32),
            "next.done": np.array([t.terminated or t.truncated for t in ep.transitions]),
            "next.truncated": np.array([t.truncated for t in ep.transitions]),
            "intervention": np.array([t.intervention for t in ep.transitions]),
            "policy_version": np.array([t.policy_version for t in ep.transitions], np.int64),
            "timestamp_ns": ts, "log_offset": np.array([t.offset for t in ep.transitions], np.int64),
            "timestamp": (np.arange(n) / self.fps).astype(np.float32), "frame_index": np.arange(n, dtype=np.int64),
            "episode_index": np.full(n, ep.index, np.int64), "index": np.arange(first, first + n, dtype=np.int64),
            "task_index": np.full(n, task_index, np.int64)})
        row = {"episode_index": ep.index, "tasks": [task], "length": n,
               "data/chunk_index": self.data["chunk"], "data/file_index": self.data["file"],
               "dataset_from_index": first, "dataset_to_index": first + n}
        self._write_data(columns)
        for key in self.plan.cameras:
            row.update(self._write_video(key, arrays[key]))
        stats = episode_stats(columns, {k: arrays[k] for k in self.plan.cameras})
        self.stats.append(stats)
        row.update({f"stats/{k}/{s}": v for k, group in to_json(stats).items() for s, v in group.items()})
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, "tether/session": ep.session,
                    "tether/episode": ep.episode, "tether/complete": ep.complete})
        self.episodes.append(row)
        self.frames += n

    def _write_data(self, columns: dict[str, np.ndarray]) -> None:
        features = self.plan.features({})
        pa, pq = _arrow()
        table = pa.table({k: _array(a, features[k]["dtype"]) for k, a in columns.items()})
        d = self.data
        if d["writer"] is None:
            path = self.root / DATA_PATH.format(chunk_index=d["chunk"], file_index=d["file"])
            path.parent.mkdir(parents=True, exist_ok=True)
            hf = {"info": {"features": {k: _hf_feature(features[k]) for k in columns}}}
            schema = table.schema.with_metadata({"huggingface": json.dumps(hf)})
            d["writer"] = pq.ParquetWriter(path, schema, compression="snappy")
        d["writer"].write_table(table.replace_schema_metadata(d["writer"].schema.metadata))
        d["bytes"] += table.nbytes
        if d["bytes"] >= DATA_MB << 20:  # the next episode starts a new file
            d["writer"].close()
            d["chunk"], d["file"] = _next_file(d["chunk"], d["file"])
            d["writer"], d["bytes"] = None, 0

    def _write_video(self, key: str, frames: np.ndarray) -> dict:
        from bridge.experience.video import VideoWriter

        v = self.videos.setdefault(key, {"chunk": 0, "file": 0, "writer": None})
        if v["writer"] is None:
            path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=v["chunk"], file_index=v["file"])
            path.parent.mkdir(parents=True, exist_ok=True)
            h, w = frames.shape[1:3]
            v["writer"] = VideoWriter(path, fps=self.fps, width=w, height=h, codec=self.codec, crf=self.crf)
            self.video_info.setdefault(key, v["writer"].info())
        writer = v["writer"]
        start = writer.frames
        for frame in frames:
            writer.add(frame)
        meta = {f"videos/{key}/chunk_index": v["chunk"], f"videos/{key}/file_index": v["file"],
                f"videos/{key}/from_timestamp": start / self.fps,
                f"videos/{key}/to_timestamp": writer.frames / self.fps}
        if writer.bytes >= VIDEO_MB << 20:
            self._close_video(v)
            v["chunk"], v["file"] = _next_file(v["chunk"], v["file"])
        return meta

    def _close_video(self, v: dict) -> None:
        if v["writer"] is not None:
            v["writer"].close()
            self.video_bytes += v["writer"].path.stat().st_size
            v["writer"] = None

    def close(self) -> None:
        if self.data["writer"] is not None:
            self.data["writer"].close()
            self.data["writer"] = None
        for v in self.videos.values():
            self._close_video(v)

    def finish(self, info_extra: dict) -> dict:
        self.close()
        pa, pq = _arrow()
        meta = self.root / "meta"
        meta.mkdir(exist_ok=True)
        features = self.plan.features(self.video_info) if self.plan else \
            {k: {"dtype": d, "shape": [1], "names": None} for k, d in _INDEX.items()}
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": None, "total_episodes": len(self.episodes),
                "total_frames": self.frames, "total_tasks": len(self.tasks), "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": DATA_MB, "video_files_size_in_mb": VIDEO_MB, "fps": self.fps,
                "splits": {"train": f"0:{len(self.episodes)}"} if self.episodes else {}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if self.video_info else None, "features": features, "tether": info_extra}
        (meta / "info.json").write_text(json.dumps(info, indent=4) + "\n")
        (meta / "stats.json").write_text(json.dumps(to_json(aggregate(self.stats)), indent=4) + "\n")
        tasks = pa.table({"task_index": pa.array(list(self.tasks.values()), pa.int64()),
                          "__index_level_0__": pa.array(list(self.tasks), pa.large_string())})
        pq.write_table(tasks.replace_schema_metadata({"pandas": json.dumps(_PANDAS_INDEX)}), meta / "tasks.parquet")
        if self.episodes:
            (self.root / EPISODES_PATH).parent.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist(self.episodes), self.root / EPISODES_PATH, compression="snappy")
        return info


_PANDAS_INDEX = {  # tasks.parquet as pandas writes it: the task string is the frame's index (LeRobot's load_tasks)
    "index_columns": ["__index_level_0__"],
    "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                        "metadata": {"encoding": "UTF-8"}}],
    "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                 "metadata": None},
                {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
                 "metadata": None}],
    "attributes": {}, "creator": {"library": "pyarrow", "version": "20.0.0"}, "pandas_version": "2.2.3"}


def _hf_feature(ft: dict) -> dict:
    value = {"dtype": ft["dtype"], "_type": "Value"}
    return value if ft["shape"] == [1] else {"feature": value, "length": ft["shape"][0], "_type": "List"}


def export_lerobot(log_dir: Path, out_dir: Path, *, selection: Selection, fps: int | None = None,
                   codec: str = "libsvtav1", crf: int = 30, task: str | None = None,
                   progress_s: float = PROGRESS_S) -> dict:
    """The episodes of the log at `log_dir` that `selection` keeps, as a LeRobotDataset v3.0 in `out_dir` (which
    must not exist or be empty; built in a sibling temp folder and renamed into place: never half-written).
    `fps`: the dataset's rate (default: from the logged step times); `codec`: "libsvtav1" (LeRobot's) or
    "libx264"; `task`: every episode's task string (default: the session's source). A status line goes to
    stderr every `progress_s` seconds. Returns a summary: totals, skipped records, cameras, fps, bytes."""
    from bridge.experience.video import CODECS

    if codec not in CODECS:
        raise ValueError(f"video codec {codec!r}: expected one of {sorted(CODECS)}")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int) or fps < 1):
        raise ValueError(f"fps {fps!r}: LeRobot's rate is a positive integer")
    skips, started, last_line = Skips(), time.monotonic(), time.monotonic()
    pending: list[LoggedEpisode] = []  # single-step episodes before the first with a step interval
    fps_source = "given"
    with staged_dir(out_dir) as tmp:
        job = _Export(tmp, fps=fps, codec_name=codec, crf=crf, task=task)
        try:
            for ep in logged_episodes(log_dir, selection, skips):
                if job.fps is None:
                    pending.append(ep)
                    if (found := _fps(ep)) is None:
                        continue
                    job.fps, fps_source = found
                for e in pending or [ep]:
                    job.add(e)
                pending.clear()
                if progress_s and time.monotonic() - last_line >= progress_s:
                    last_line = time.monotonic()
                    print(f"lerobot export: {len(job.episodes)} episodes, {job.frames} frames, "
                          f"{last_line - started:.0f} s", file=sys.stderr, flush=True)
            if job.fps is None:
                job.fps, fps_source = DEFAULT_FPS, "default (single-step episodes only)"
            for e in pending:
                job.add(e)
            info = job.finish({"source": str(log_dir), "skipped": skips.count, "first_skipped": skips.first,
                               "fps": fps_source,
                               "alignment": "frame i of an episode and of its videos is step i; timestamp = "
                                            "frame_index / fps; timestamp_ns: the step's own time"})
        finally:
            job.close()
        size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    return {"total_episodes": info["total_episodes"], "total_frames": info["total_frames"], "fps": info["fps"],
            "fps_source": fps_source,
            "cameras": job.plan.cameras if job.plan else [], "codec": codec, "skipped": skips.count,
            "first_skipped": skips.first, "video_bytes": job.video_bytes, "bytes": size, "out": str(out_dir),
            "seconds": round(time.monotonic() - started, 3)}


# ---------------------------------------------------------------- import


def _load_info(root: Path) -> dict:
    path = root / "meta" / "info.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (not a LeRobotDataset)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise ValueError(f"{path}: codebase_version {info.get('codebase_version')!r}, this reader takes "
                         f"{CODEBASE_VERSION!r}")
    if not isinstance(info.get("fps"), int | float) or info["fps"] <= 0 or not isinstance(info.get("features"), dict):
        raise ValueError(f"{path}: needs a positive fps and a features object")
    for key, ft in info["features"].items():
        if not isinstance(ft, dict) or "dtype" not in ft or not isinstance(ft.get("shape"), list):
            raise ValueError(f"{path}: feature {key!r} needs a dtype and a shape")
        if ft["dtype"] in ("video", "image") and len(ft["shape"]) != 3:
            raise ValueError(f"{path}: feature {key!r} is a {ft['dtype']} of shape {ft['shape']}, not (H, W, C)")
    return info


def _episodes(root: Path) -> dict[int, dict]:
    _, pq = _arrow()
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    if not files:
        raise ValueError(f"{root / 'meta' / 'episodes'}: no episodes parquet files")
    out = {}
    for f in files:
        table = pq.read_table(f)
        keep = [c for c in table.column_names if not c.startswith("stats/")]
        for row in table.select(keep).to_pylist():
            if "episode_index" not in row or "dataset_to_index" not in row:
                raise ValueError(f"{f}: episodes need episode_index, dataset_from_index and dataset_to_index")
            out[int(row["episode_index"])] = row
    return out


def _column(table: pa.Table, key: str, ft: dict, path: Path) -> np.ndarray | list:
    pa, _ = _arrow()
    if key not in table.column_names:
        raise ValueError(f"{path}: feature {key!r} (meta/info.json) has no column")
    col = table.column(key).combine_chunks()
    if ft["dtype"] == "image":
        return [np.asarray(_png(v["bytes"])) for v in col.to_pylist()]
    size = int(np.prod(ft["shape"]))
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        values = col.flatten()
        if len(values) != size * len(col) or not all(len(x) == size for x in col.to_pylist()[:1]):
            raise ValueError(f"{path}: feature {key!r}: rows of {len(col.to_pylist()[0]) if len(col) else 0} "
                             f"values, info.json's shape is {ft['shape']}")
        a = values.to_numpy(zero_copy_only=False)
    elif size == 1:
        a = col.to_numpy(zero_copy_only=False)
    else:
        raise ValueError(f"{path}: feature {key!r}: a scalar column, info.json's shape is {ft['shape']}")
    if key in _INDEX or key in _EXTRAS:
        return a.astype(ft["dtype"]).reshape(len(col))
    return a.astype(ft["dtype"]).reshape(len(col), *ft.get("tether_shape", ft["shape"]))


def _png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _tensor_name(key: str) -> str:
    for prefix in ("observation.images.", "observation."):
        if key.startswith(prefix):
            return "observation" if key == "observation.state" else key[len(prefix):]
    return key


def iter_lerobot(dataset_dir: str | Path, *, tolerance_s: float = 1e-4) -> Iterator[experience_pb2.Transition]:
    """The frames of a LeRobotDataset v3.0 folder as Transitions, in `index` order per data file: observation tensors
    named back (`observation.state` -> "observation", `observation.images.X` -> "X", uint8 (H, W, 3) decoded from
    the MP4, the frame at from_timestamp + timestamp within `tolerance_s`), `action` as applied_action and action
    (`policy_action` as action when the folder has it), offset = `index`, episode, step = frame_index, reward =
    `next.reward`, the last frame terminated (truncated when `next.done` says not done, or `next.truncated`),
    intervention (True unless the folder says), source "lerobot:<folder name>". ValueError naming the file and
    feature for a malformed folder."""
    _, pq = _arrow()
    root = Path(dataset_dir)
    info = _load_info(root)
    episodes = _episodes(root)
    features = info["features"]
    if "action" not in features:
        raise ValueError(f"{root / 'meta/info.json'}: no 'action' feature")
    videos = [k for k in features if k.startswith("observation.") and features[k]["dtype"] == "video"]
    columns = [k for k in features if features[k]["dtype"] not in ("video", "string")]
    data_files = sorted({(int(e["data/chunk_index"]), int(e["data/file_index"])) for e in episodes.values()})
    for e in episodes.values():
        for key in videos:
            path = root / info["video_path"].format(video_key=key, chunk_index=e[f"videos/{key}/chunk_index"],
                                                    file_index=e[f"videos/{key}/file_index"])
            if not path.is_file():
                raise ValueError(f"{path}: missing (video of {key!r}, episode {e['episode_index']})")
    source = f"lerobot:{root.resolve().name}"
    cursors: dict[Path, FrameCursor] = {}
    try:
        for chunk, file in data_files:
            path = root / info["data_path"].format(chunk_index=chunk, file_index=file)
            if not path.is_file():
                raise ValueError(f"{path}: missing (data file of the episodes in meta/episodes)")
            table = pq.read_table(path)
            cols = {k: _column(table, k, features[k], path) for k in columns}
            for i in range(table.num_rows):
                ep = episodes.get(int(cols["episode_index"][i]))
                if ep is None:
                    raise ValueError(f"{path}: row {i}: episode {int(cols['episode_index'][i])} not in meta/episodes")
                yield _transition(cols, i, ep, info, root, videos, cursors, tolerance_s, source)
    finally:
        for c in cursors.values():
            c.close()


def _transition(cols, i, ep, info, root, videos, cursors, tolerance_s, source) -> experience_pb2.Transition:
    from bridge.experience.video import FrameCursor

    features = info["features"]
    index, frame = int(cols["index"][i]), int(cols["frame_index"][i])
    obs = [codec.encode(_tensor_name(k), np.asarray(cols[k][i])) for k in cols
           if k.startswith("observation.") and k in features]
    for key in videos:
        path = root / info["video_path"].format(video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"],
                                                file_index=ep[f"videos/{key}/file_index"])
        cursor = cursors.setdefault(path, FrameCursor(path, tolerance_s=tolerance_s))
        image = cursor.at(float(ep[f"videos/{key}/from_timestamp"]) + float(cols["timestamp"][i]))
        if list(image.shape) != list(features[key]["shape"]):
            raise ValueError(f"{path}: frames are {list(image.shape)}, info.json's {key!r} is {features[key]['shape']}")
        obs.append(codec.encode(_tensor_name(key), image))
    applied = [codec.encode("action", np.asarray(cols["action"][i]))]
    policy = [codec.encode("action", np.asarray(cols["policy_action"][i]))] if "policy_action" in cols else applied
    last = index == int(ep["dataset_to_index"]) - 1
    done = bool(cols["next.done"][i]) if "next.done" in cols else True
    truncated = not done or ("next.truncated" in cols and bool(cols["next.truncated"][i]))
    return experience_pb2.Transition(
        offset=index, session=source, episode=int(ep["episode_index"]), step=frame,
        step_type=bridge_pb2.FIRST if frame == 0 else bridge_pb2.MID, observation=obs, action=policy,
        applied_action=applied, reward=float(cols["next.reward"][i]) if "next.reward" in cols else 0.0,
        terminated=last and not truncated, truncated=last and truncated,
        policy_version=int(cols["policy_version"][i]) if "policy_version" in cols else 0,
        intervention=bool(cols["intervention"][i]) if "intervention" in cols else True,
        timing=bridge_pb2.Timing(gateway_recv_ns=int(cols["timestamp_ns"][i]) if "timestamp_ns" in cols else 0),
        source=source)


def read_lerobot(dataset_dir: str | Path, *, tolerance_s: float = 1e-4) -> list[experience_pb2.Transition]:
    """`iter_lerobot` as a list (every camera frame decoded and held: mind the memory of a large dataset)."""
    return list(iter_lerobot(dataset_dir, tolerance_s=tolerance_s))
