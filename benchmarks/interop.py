"""LeRobot and Foxglove: export throughput and size against the MCAP log, and the live view's cost per step.

    python benchmarks/interop.py [--seconds 20 --log RUN_DIR --repeats 3 --viewers 0,1,4 --rounds 4
                                  --per-round 150 --json PATH]

Exports: a log recorded through the real path unless --log names one (`tether demo --camera --horizon 1
--envs 2 --rate 30`: two MuJoCo robots, top and front cameras 224x224 sent as JPEG, one step per tick at 30 Hz,
Triton serving the camera policy, the gateway logging), exported `--repeats` times as LeRobotDataset v3
(`tether log export --format lerobot`: parquet + one MP4 per camera) and as a Foxglove recording (`--format
foxglove`: MCAP with Foxglove's schemas); the median wall time gives transitions/s and camera frames/s, the
output's bytes are set against the log's.

Live view: a gateway with camera robots stepping (two 224x224 JPEG cameras, `--per-round` steps per round),
`tether view` subscribed to its experience stream, and 0, 1 or 4 Foxglove WebSocket viewers reading every
channel; rounds alternate the viewer counts, so the step round trip medians (and their ratio to 0 viewers) are
measured side by side on the same machine load. Frames the view dropped for viewers that fell behind are
counted.

Prints a table and writes JSON (default benchmarks/results/interop.json).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import machine, parser, report, say
from camera_serving import CAMERAS, MODEL, hello, observation_tensors, rendered_frames

from bridge.client import Session
from bridge.experience.reader import read_transitions
from bridge.experience.selection import Selection
from bridge.experience.tool import EXPORTERS, find_log_dir
from protos import bridge_pb2

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the viewers' client lives in tests/support
    sys.path.insert(0, str(ROOT))
from inference_server import ModelRepository, TritonServer  # noqa: E402
from tether.topology import gateway_process, view_process  # noqa: E402
from trainer.camera_policy import CameraChunkPolicy, chunk_spec  # noqa: E402


def record(run_dir: Path, seconds: float) -> Path:
    """Two camera robots at 30 Hz through Triton and the gateway for `seconds`; returns the log's folder."""
    cmd = [str(ROOT / ".venv" / "bin" / "tether"), "demo", "--camera", "--horizon", "1", "--envs", "2",
           "--rate", "30", "--seconds", str(seconds), "--run-dir", str(run_dir)]
    say(f"recording: {' '.join(cmd[1:])}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return find_log_dir(run_dir)


def tree_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def log_facts(log_dir: Path) -> dict:
    transitions = frames = 0
    for t in read_transitions(log_dir):
        transitions += 1
        frames += sum(1 for x in t.observation if len(x.shape) == 3)
    return {"transitions": transitions, "camera_frames": frames, "bytes": tree_bytes(log_dir)}


def time_exports(log_dir: Path, repeats: int, facts: dict) -> dict:
    out = {}
    with tempfile.TemporaryDirectory(prefix="tether-interop-") as tmp:
        for fmt, name in (("lerobot", "dataset"), ("foxglove", "run.mcap"), ("npz", "npz")):
            walls, size, info = [], 0, {}
            for r in range(repeats):
                target = Path(tmp) / f"{fmt}-{r}" / name
                t0 = time.perf_counter()
                info = EXPORTERS[fmt](log_dir, target, selection=Selection())
                walls.append(time.perf_counter() - t0)
                size = tree_bytes(target)
            wall = statistics.median(walls)
            out[fmt] = {"wall_s_p50": round(wall, 3), "walls_s": [round(w, 3) for w in walls],
                        "transitions_per_s": round(facts["transitions"] / wall, 1),
                        "camera_frames_per_s": round(facts["camera_frames"] / wall, 1),
                        "bytes": size, "bytes_vs_log": round(size / facts["bytes"], 3),
                        "episodes": info.get("total_episodes"), "frames": info.get("total_frames")}
            say(f"{fmt}: {wall:.2f} s p50 over {repeats}, {size / 1e6:.2f} MB")
    return out


# -- the live view's cost per step --------------------------------------------------------------------------

def view_stats(info: dict) -> dict:
    with urllib.request.urlopen(info["stats"], timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def viewers(info: dict, config: str):
    """`config` viewers ("4", or "1 slow": connected, never reading) in a process of their own, connected and
    subscribed before it yields; gone after."""
    count, slow = int(config.split()[0]), config.endswith("slow")
    if count == 0:
        yield
        return
    before = view_stats(info)["viewers_total"]
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.foxglove_client", info["url"], "--viewers",
                             str(count), "--seconds", "3600", *(["--slow"] if slow else [])], cwd=ROOT,
                            stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while view_stats(info)["viewers_total"] < before + count:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{count} viewers did not connect (exit {proc.poll()})")
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait()


async def step_round_trips(address: str, payloads: list[list], obs, act, *, robots: int, steps: int,
                           tag: str, start: int = 0) -> tuple[list[int], int]:
    """`robots` camera sessions stepping `steps` times each as fast as replies come, from step `start` (a session
    resumed under its id goes on from its last step); every answered round trip (ns), and how many steps missed
    the gateway's deadline (counted, not timed; any other error ends the run)."""
    misses = 0

    async def one(i: int) -> list[int]:
        nonlocal misses
        samples = []
        async with Session(address, hello(f"{tag}-{i}", obs, act, jpeg=True)) as s:
            for step in range(start, start + steps):
                t0 = time.perf_counter_ns()
                reply = await s.step(bridge_pb2.Observation(
                    step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                    tensors=payloads[(step + i) % len(payloads)]))
                if reply.WhichOneof("kind") == "error" and reply.error.code == bridge_pb2.StepError.DEADLINE_EXCEEDED:
                    misses += 1
                    continue
                if reply.WhichOneof("kind") != "action":
                    raise RuntimeError(f"{tag}-{i} step {step}: {reply}")
                samples.append(time.perf_counter_ns() - t0)
        return samples

    return [x for s in await asyncio.gather(*(one(i) for i in range(robots))) for x in s], misses


def live_cost(configs: list[str], *, rounds: int, per_round: int, robots: int = 2) -> dict:
    """Step round trips of `robots` camera robots (two 224x224 JPEG cameras) with each viewer config, rounds
    alternating the order; the view subscribed to the gateway's log throughout."""
    frames, obs, act = rendered_frames(30)
    state = next(s for s in obs if s.name not in CAMERAS)
    policy = CameraChunkPolicy(state, [s for s in obs if s.name in CAMERAS], act[0], horizon=1, seed=0)
    chunk_act = (chunk_spec(act[0], 1),)
    payloads = [observation_tensors(f, jpeg=True) for f in frames]
    samples: dict[str, list[int]] = {c: [] for c in configs}
    dropped: dict[str, int] = dict.fromkeys(configs, 0)
    misses: dict[str, int] = dict.fromkeys(configs, 0)
    with tempfile.TemporaryDirectory(prefix="tether-interop-live-") as tmp:
        run_dir = Path(tmp)
        repo = ModelRepository(run_dir / "models")
        repo.write_version(MODEL, 1, policy, policy.inputs, policy.outputs)
        with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
                gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gateway.log",
                                extra_args=("--experience-dir", str(run_dir / "experience"))) as gw, \
                view_process(gw, run_dir / "view.log") as info:
            # the same robots every round: their channels are advertised from here on, so viewers that connect
            # later (the slow ones subscribe once) watch them from their first step
            asyncio.run(step_round_trips(gw, payloads, obs, chunk_act, robots=robots, steps=30, tag="robot"))
            start = 30
            for r in range(rounds):
                for config in (configs if r % 2 == 0 else configs[::-1]):
                    with viewers(info, config):
                        before = view_stats(info)["dropped"]
                        answered, missed = asyncio.run(step_round_trips(
                            gw, payloads, obs, chunk_act, robots=robots, steps=per_round, tag="robot",
                            start=start))
                        samples[config] += answered
                        misses[config] += missed
                        start += per_round
                        dropped[config] += view_stats(info)["dropped"] - before
                say(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{c}: {statistics.median(v) / 1e6:.2f} ms" for c, v in samples.items()))
            feed = view_stats(info)
    none = statistics.median(samples[configs[0]])
    out = {c: {"rtt_ms_p50": round(statistics.median(v) / 1e6, 3),
               "ratio_vs_none": round(statistics.median(v) / none, 3), "steps": len(v), "dropped": dropped[c],
               "deadline_misses": misses[c]}
           for c, v in samples.items()}
    out["_view"] = {k: feed.get(k) for k in ("published", "sent", "dropped", "acked_through", "log_end", "jumped")}
    return out


def print_table(r: dict) -> None:
    f = r["log"]
    print(f"\nlog: {f['transitions']} transitions, {f['camera_frames']} camera frames, {f['bytes'] / 1e6:.2f} MB "
          f"({r['log_source']})")
    print(f"\n{'export':<10}{'s (p50)':>9}{'trans/s':>10}{'frames/s':>10}{'MB':>8}{'x log':>7}{'episodes':>10}")
    for fmt, e in r["exports"].items():
        print(f"{fmt:<10}{e['wall_s_p50']:>9.2f}{e['transitions_per_s']:>10.0f}{e['camera_frames_per_s']:>10.0f}"
              f"{e['bytes'] / 1e6:>8.2f}{e['bytes_vs_log']:>7.2f}{e['episodes']!s:>10}")
    if "live" in r:
        print(f"\n{'viewers':<10}{'rtt p50 ms':>12}{'vs 0':>7}{'steps':>8}{'dropped':>9}{'missed':>8}")
        for n, v in r["live"].items():
            if n.startswith("_"):
                continue
            print(f"{n:<10}{v['rtt_ms_p50']:>12.2f}{v['ratio_vs_none']:>7.3f}{v['steps']:>8}{v['dropped']:>9}"
                  f"{v['deadline_misses']:>8}")


def main() -> None:
    p = parser(__file__, __doc__, rounds=(4, "live view: rounds of every viewer count"),
               per_round=(150, "live view: steps per robot and round"))
    p.add_argument("--seconds", type=float, default=20.0, help="how long to record (default %(default)s)")
    p.add_argument("--log", type=Path, help="export this run dir or log instead of recording one")
    p.add_argument("--repeats", type=int, default=3, help="exports of each format (median taken)")
    p.add_argument("--viewers", default="0,1,4,1 slow", help="viewer configs of the live part, the first the "
                   "baseline ('N slow': N viewers that never read; '' skips it)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-interop-run-") as tmp:
        log_dir = find_log_dir(a.log) if a.log else record(Path(tmp) / "run", a.seconds)
        facts = log_facts(log_dir)
        result = {"machine": machine(cpus=os.cpu_count(), load=os.getloadavg()), "log": facts,
                  "log_source": str(a.log) if a.log else f"tether demo --camera --horizon 1 --envs 2 --rate 30 "
                                                        f"--seconds {a.seconds:g}",
                  "exports": time_exports(log_dir, a.repeats, facts)}
    if a.viewers:
        result["live"] = live_cost([v.strip() for v in a.viewers.split(",")], rounds=a.rounds,
                                   per_round=a.per_round)
    report(a.json, result, print_table)


if __name__ == "__main__":
    sys.exit(main())
