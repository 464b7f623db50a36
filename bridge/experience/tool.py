"""`tether log`: summarise an experience log, or export it as a dataset.

    tether log inspect runs/demo              # a run dir (its experience/) or a log dir; --json for JSON
    tether log export runs/demo/experience out/ds --format lerobot   # LeRobotDataset v3 (bridge.experience.lerobot)
    tether log export runs/demo out/run.mcap --format foxglove        # Foxglove's schemas (bridge.experience.foxglove)
    tether log export runs/demo/experience out/bc-data [--complete-only] [--policy P] [--versions 3:7]
    tether log merge gw-a/experience gw-b/experience [--out merged/] [--json]   # several gateways' logs

Every format takes the same filters (bridge.experience.selection: policy, versions, time range, complete
episodes, episodes with interventions). The default format is LeRobotDataset-like without parquet: one
`.npz` per episode, `data/chunk-000/episode_000000.npz` with columns `observation.<tensor>`, `action.<tensor>`,
`applied_action.<tensor>`, `reward`, `terminated`, `truncated`, `step`, `offset`, `timestamp_ns`,
`policy_version`, `log_prob` (NaN when not stochastic), `intervention` (a person's command was applied:
`applied_action` is theirs, `action` the policy's own), `frame_index`, `episode_index`; plus
`meta/info.json` (features with dtype and shape, totals) and `meta/episodes.jsonl`. Read it with
`np.load(path)`: no Tether needed. Reading the log never changes it (a torn tail is read up to its
last complete record). A record that cannot be used (not a transition, a tensor that does not decode,
NaN/inf, a non-finite reward, a tensor shaped unlike the log's earlier ones) is skipped and counted:
`skipped` in the summary and in info.json (with the first one's offset and problem), never a crash.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from bridge.common.errors import CommandError
from bridge.common.files import staged_dir
from bridge.experience.reader import read_transitions
from bridge.experience.segment import list_segments, scan_segment
from bridge.experience.selection import Selection, Skips, add_selection_flags, logged_episodes, selection_from_args
from protos import codec, experience_pb2

CHUNK_EPISODES = 1000


def find_log_dir(path: str | Path) -> Path:
    """`path` itself if it holds segments, else its `experience/` (a run dir), else its one child that does."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if list_segments(path):
        return path
    if list_segments(path / "experience"):
        return path / "experience"
    found = [c for c in sorted(path.iterdir()) if c.is_dir() and list_segments(c)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ValueError(f"{path}: several experience logs inside ({', '.join(c.name for c in found)}); name one")
    raise FileNotFoundError(f"{path}: no experience log (segment-*.mcap) here or in {path / 'experience'}")


def inspect(path: str | Path) -> dict:
    """The summary `tether log inspect` prints, as a dict."""
    log_dir = find_log_dir(path)
    segments = []
    for _, p in list_segments(log_dir):
        scan = scan_segment(p)
        segments.append({"name": p.name, "bytes": p.stat().st_size, "first_offset": scan.first_offset,
                         "transitions": scan.count, "finished": scan.finished,
                         "start_ns": scan.start_ns, "end_ns": scan.end_ns})
    n, first, last = 0, None, None
    sessions: Counter[str] = Counter()
    episodes: dict[tuple[str, int], dict] = {}
    versions: Counter[str] = Counter()
    rewards: Counter[str] = Counter()
    interventions = 0
    skips = Skips()
    for t in read_transitions(log_dir, on_skip=skips.record):
        if not skips.usable(t):
            continue
        n += 1
        first = t.offset if first is None else first
        last = t.offset
        sessions[t.session] += 1
        ep = episodes.setdefault((t.session, t.episode), {"return": 0.0, "length": 0, "done": False})
        ep["return"] += t.reward
        ep["length"] += 1
        ep["done"] = ep["done"] or t.terminated or t.truncated
        versions[f"{t.policy}:{t.policy_version}"] += 1
        rewards[t.reward_version or "-"] += 1
        interventions += t.intervention
    done = [e["return"] for e in episodes.values() if e["done"]]
    starts = [s["start_ns"] for s in segments if s["transitions"]]
    ends = [s["end_ns"] for s in segments if s["transitions"]]
    return {
        "log_dir": str(log_dir),
        "segments": segments,
        "transitions": n,
        "offsets": [first, last] if n else None,
        "bytes": sum(s["bytes"] for s in segments),
        "sessions": len(sessions),
        "episodes": len(episodes),
        "completed_episodes": len(done),
        "returns": ({"mean": float(np.mean(done)), "min": float(np.min(done)), "max": float(np.max(done)),
                     "last": done[-1]} if done else None),
        "policy_versions": dict(sorted(versions.items())),
        "reward_versions": dict(sorted(rewards.items())),
        "interventions": interventions,
        "time_span_s": (max(ends) - min(starts)) / 1e9 if starts else 0.0,
        "skipped": skips.count,
        "first_skipped": skips.first,
    }


def print_summary(s: dict, out=None) -> None:
    out = out or sys.stdout

    def row(k, v):
        print(f"{k:<20}{v}", file=out)

    row("log", s["log_dir"])
    row("transitions", f"{s['transitions']}" + (f"  (offsets {s['offsets'][0]}..{s['offsets'][1]})" if s["offsets"]
                                                 else ""))
    row("sessions", s["sessions"])
    row("episodes", f"{s['episodes']} ({s['completed_episodes']} completed)")
    if s["returns"]:
        r = s["returns"]
        row("return", f"mean {r['mean']:.2f}  min {r['min']:.2f}  max {r['max']:.2f}  last {r['last']:.2f}")
    row("bytes", f"{s['bytes']} ({s['bytes'] / 1e6:.1f} MB)")
    row("time span", f"{s['time_span_s']:.1f} s")
    row("reward versions", ", ".join(f"{k} ({v})" for k, v in s["reward_versions"].items()) or "-")
    if s.get("interventions"):
        row("interventions", f"{s['interventions']} transitions a person's command acted "
                             f"({s['interventions'] / max(s['transitions'], 1):.1%})")
    if s.get("skipped"):
        first = s["first_skipped"]
        row("skipped", f"{s['skipped']} unusable record(s) (first: offset {first['offset']}: {first['problem']})")
    print(f"\n{'policy:version':<30}{'transitions':>12}", file=out)
    for k, v in s["policy_versions"].items():
        print(f"{k:<30}{v:>12}", file=out)
    print(f"\n{'segment':<22}{'first offset':>13}{'transitions':>12}{'bytes':>12}  finished", file=out)
    for seg in s["segments"]:
        print(f"{seg['name']:<22}{seg['first_offset']!s:>13}{seg['transitions']:>12}{seg['bytes']:>12}  "
              f"{'yes' if seg['finished'] else 'no (open or torn)'}", file=out)


class _Episode:
    """The columns of one episode, gathered transition by transition."""

    def __init__(self, index: int, session: str, episode: int):
        self.index, self.session, self.episode = index, session, episode
        self.cols: dict[str, list] = defaultdict(list)
        self.next_obs: dict[str, np.ndarray] = {}
        self.terminated = self.truncated = False

    def add(self, t: experience_pb2.Transition) -> None:
        for prefix, tensors in (("observation", t.observation), ("action", t.action),
                                ("applied_action", t.applied_action)):
            for x in tensors:
                key = f"{prefix}.{x.name}"
                a = codec.decode(x)
                if self.cols[key] and self.cols[key][-1].shape != a.shape:
                    raise ValueError(f"session {self.session!r} episode {self.episode} step {t.step}: {key} has "
                                     f"shape {list(a.shape)}, earlier steps {list(self.cols[key][-1].shape)}")
                self.cols[key].append(a)
        for x in t.next_observation:
            self.next_obs[f"next_observation.{x.name}"] = codec.decode(x)[None]
        c = self.cols
        c["reward"].append(t.reward)
        c["terminated"].append(t.terminated)
        c["truncated"].append(t.truncated)
        c["step"].append(t.step)
        c["offset"].append(t.offset)
        c["timestamp_ns"].append(t.timing.gateway_recv_ns)
        c["policy_version"].append(t.policy_version)
        c["log_prob"].append(t.log_prob if t.has_log_prob else np.nan)
        c["intervention"].append(t.intervention)
        self.terminated, self.truncated = t.terminated, t.truncated

    @property
    def length(self) -> int:
        return len(self.cols["step"])

    def arrays(self) -> dict[str, np.ndarray]:
        dtypes = {"reward": np.float64, "terminated": np.bool_, "truncated": np.bool_, "step": np.int64,
                  "offset": np.int64, "timestamp_ns": np.int64, "policy_version": np.int64, "log_prob": np.float32,
                  "intervention": np.bool_}
        out = {k: np.asarray(v, dtype=dtypes.get(k)) if k in dtypes else np.stack(v) for k, v in self.cols.items()}
        out["frame_index"] = np.arange(self.length, dtype=np.int64)
        out["episode_index"] = np.full(self.length, self.index, dtype=np.int64)
        out.update(self.next_obs)
        return out


def export(log_dir: str | Path, out_dir: str | Path, *, selection: Selection | None = None) -> dict:
    """Writes the dataset (see module docstring) into `out_dir`, which must not exist or be empty. It is
    built in a sibling temporary directory and renamed into place: never half-written. Returns info.json."""
    log_dir = find_log_dir(log_dir)
    written: list[dict] = []
    features: dict[str, dict] = {}
    frames, policies, reward_versions = 0, Counter(), Counter()
    skips = Skips()
    with staged_dir(out_dir) as tmp:
        (tmp / "meta").mkdir()
        for logged in logged_episodes(log_dir, selection or Selection(), skips):
            ep = _Episode(logged.index, logged.session, logged.episode)
            for t in logged.transitions:
                ep.add(t)
                policies[t.policy] += 1
                reward_versions[t.reward_version] += 1
            frames += ep.length
            arrays = ep.arrays()
            for k, a in arrays.items():
                spec = {"dtype": str(a.dtype), "shape": list(a.shape[1:])}
                if features.setdefault(k, spec) != spec:
                    raise ValueError(f"session {ep.session!r} episode {ep.episode}: {k} is {spec}, "
                                     f"earlier episodes {features[k]}")
            path = tmp / "data" / f"chunk-{ep.index // CHUNK_EPISODES:03d}" / f"episode_{ep.index:06d}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **arrays)
            written.append({"episode_index": ep.index, "session": ep.session, "episode": ep.episode,
                            "length": ep.length, "return": float(arrays["reward"].sum()),
                            "complete": logged.complete, "terminated": ep.terminated, "truncated": ep.truncated,
                            "policy_versions": sorted({int(v) for v in arrays["policy_version"]})})
        info = {"codebase": "tether", "format": "npz per episode (LeRobotDataset-like layout)",
                "source": str(log_dir), "total_episodes": len(written),
                "total_frames": sum(e["length"] for e in written), "transitions_read": frames,
                "chunks_size": CHUNK_EPISODES, "data_path": "data/chunk-{chunk:03d}/episode_{episode_index:06d}.npz",
                "features": features, "policies": dict(policies), "reward_versions": dict(reward_versions),
                "skipped": skips.count, "first_skipped": skips.first}
        (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        (tmp / "meta" / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))
    return info


def merge(log_dirs: list[Path], out_dir: Path | None = None) -> dict:
    """Several gateways' logs merged by ownership epoch (bridge.experience.merge): the summary, and with `out_dir`
    the merged transitions written there as a new log (offsets from 0; inspect or export it as any log)."""
    import asyncio

    from bridge.experience.log import ExperienceLog
    from bridge.experience.merge import merge_logs

    merged = merge_logs([find_log_dir(d) for d in log_dirs])
    if out_dir is not None:
        if out_dir.exists() and any(out_dir.iterdir()):
            raise ValueError(f"{out_dir}: not empty (the merged log is written into a new directory)")

        async def write() -> None:
            async with ExperienceLog(out_dir, fsync=False) as log:
                futures = []
                for t in merged.transitions:
                    copy = experience_pb2.Transition()
                    copy.CopyFrom(t)
                    futures.append(log.append(copy))
                await asyncio.gather(*(f for f in futures if f is not None))

        asyncio.run(write())
    return {**merged.summary(), "out": str(out_dir) if out_dir is not None else None}


def _lerobot(log_dir: Path, out: Path, *, selection: Selection, **options) -> dict:
    from bridge.experience.lerobot import export_lerobot  # pyarrow and PyAV only when asked for

    return export_lerobot(find_log_dir(log_dir), out, selection=selection, **options)


def _foxglove(log_dir: Path, out: Path, *, selection: Selection) -> dict:
    from bridge.experience.foxglove import export_foxglove

    return export_foxglove(find_log_dir(log_dir), out, selection=selection)


EXPORTERS = {"npz": export, "lerobot": _lerobot, "foxglove": _foxglove}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether log", description="Inspect or export an experience log.")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="summary: segments, transitions, sessions, episodes, returns, versions")
    i.add_argument("path", type=Path, help="a run dir (with experience/) or a log dir")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    e = sub.add_parser("export", help="the log as a dataset: LeRobotDataset v3, a Foxglove recording, or .npz "
                       "episodes (docs/interop.md)")
    e.add_argument("log_dir", type=Path, help="the experience log (a run dir, a log dir or a JetStream archive)")
    e.add_argument("out", type=Path, help="where it goes (a new folder; for foxglove a .mcap file); written whole, "
                   "then renamed into place")
    e.add_argument("--format", choices=EXPORTERS, default="npz",
                   help="lerobot: LeRobotDataset v3 (parquet, one MP4 per camera); foxglove: MCAP with Foxglove's "
                   "schemas; npz: one .npz per episode (default)")
    add_selection_flags(e)
    lr = e.add_argument_group("--format lerobot")
    lr.add_argument("--fps", type=int, help="the dataset's frame rate (default: the logged steps' median interval)")
    lr.add_argument("--codec", choices=("libsvtav1", "libx264"), default="libsvtav1",
                    help="camera videos: AV1 as LeRobot writes them (default) or H.264 for players without AV1")
    lr.add_argument("--task", help="every episode's task string (default: the session's source)")
    m = sub.add_parser("merge", help="several gateways' logs as one: per (session, step) the newest ownership "
                       "epoch's record; a fenced gateway's late writes dropped (docs/operations.md)")
    m.add_argument("log_dirs", type=Path, nargs="+", help="the logs (run dirs or log dirs)")
    m.add_argument("--out", type=Path, help="write the merged transitions here as a new log")
    m.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    try:
        if a.command == "inspect":
            summary = inspect(a.path)
            if a.json:
                print(json.dumps(summary, indent=2))
            else:
                print_summary(summary)
        elif a.command == "merge":
            summary = merge(a.log_dirs, a.out)
            if a.json:
                print(json.dumps(summary, indent=2))
            else:
                print(f"{summary['transitions']} transitions of {summary['sessions']} sessions kept "
                      f"({summary['moved_sessions']} moved between gateways); dropped: {summary['stale']} of an "
                      f"older owner's epoch, {summary['duplicates']} duplicates"
                      + (f"; written to {summary['out']}" if summary["out"] else ""))
        else:
            options = {"fps": a.fps, "codec": a.codec, "task": a.task} if a.format == "lerobot" else {}
            if not options and (a.fps, a.codec, a.task) != (None, "libsvtav1", None):
                raise ValueError(f"--fps, --codec and --task are --format lerobot's, not {a.format}'s")
            info = EXPORTERS[a.format](a.log_dir, a.out, selection=selection_from_args(a), **options)
            first = info["first_skipped"]
            print(f"wrote {info['total_episodes']} episodes, {info['total_frames']} frames to {a.out}"
                  + (f" ({info['skipped']} unusable record(s) skipped, first at offset {first['offset']}: "
                     f"{first['problem']})" if info["skipped"] else ""))
            if info.get("layout"):
                print(f"Foxglove layout: {info['layout']} (Layouts > Import in Foxglove)")
    except (OSError, ValueError) as exc:
        raise CommandError(exc, prog=f"tether log {a.command}") from None
